"""A grouped-query family's ``Family``: the shared attention, sizes and megatron-core builders, with the
family's own names, config class, tensor table, config.json translation and serving facts."""

from __future__ import annotations

from types import ModuleType

from megatron_mtp.models.family import Family, ServingFacts, lazy
from megatron_mtp.models.gqa import size


def grouped_query_family(*, name: str, title: str, architecture: str, model_config: type, hf_mapping: ModuleType,
                         hf_config: ModuleType, hf_config_json: ModuleType, serving: ServingFacts) -> Family:
    """The Family of a grouped-query model (``hf_mapping``: a module with ``TABLE`` and ``ATTENTION_ORDER``;
    ``hf_config``: with ``to_hf_config``, ``from_hf_config``, ``carry_source_fields``; ``hf_config_json``:
    with ``parse_hf_config``)."""
    return Family(
        name=name,
        title=title,
        hf_architectures=(architecture,),
        hf_model_types=(name,),
        model_config=model_config,
        table=hf_mapping.TABLE,
        attention_order=hf_mapping.ATTENTION_ORDER,
        attention_shape=size.attention_shape,
        build_transformer_config=lazy("megatron_mtp.models.gqa.transformer_config:build_transformer_config"),
        build_model=lazy("megatron_mtp.models.gqa.model:build_model"),
        layer_sizes=size.layer_sizes,
        parameter_counts=size.parameter_counts,
        training_flops_per_token=size.training_flops_per_token,
        kv_cache_elements_per_token=size.kv_cache_elements_per_token,
        decode_attention_flops=size.decode_attention_flops,
        to_hf_config=hf_config.to_hf_config,
        from_hf_config=hf_config.from_hf_config,
        carry_source_fields=hf_config.carry_source_fields,
        hf_view=hf_config_json.parse_hf_config,
        attention="gqa",
        serving=serving,
    )
