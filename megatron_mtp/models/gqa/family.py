"""A grouped-query family's ``Family``: the shared attention, sizes and megatron-core builders, with the
family's own names, config class, tensor table, config.json translation and serving facts."""

from __future__ import annotations

from types import ModuleType

from megatron_mtp.models.family import Family, ServingFacts, family_of_modules
from megatron_mtp.models.gqa import sizes


def grouped_query_family(*, name: str, title: str, architecture: str, model_config: type, hf_mapping: ModuleType,
                         hf_config: ModuleType, hf_view: ModuleType, serving: ServingFacts) -> Family:
    """The Family of a grouped-query model (``hf_mapping``: a module with ``TABLE`` and ``ATTENTION_ORDER``;
    ``hf_config``: with ``to_hf_config``, ``from_hf_config``, ``carry_source_fields``; ``hf_view``:
    with ``parse_hf_config``)."""
    return family_of_modules(name=name, title=title, architectures=(architecture,), model_types=(name,),
                             model_config=model_config, builders="megatron_mtp.models.gqa", sizes=sizes,
                             hf_mapping=hf_mapping, hf_config=hf_config, hf_view=hf_view,
                             decoder="megatron_mtp.models.decoding.gqa:GQADecoderLayer",
                             activations="megatron_mtp.models.gqa.activations", serving=serving)
