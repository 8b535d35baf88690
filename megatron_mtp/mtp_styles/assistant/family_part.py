"""What a family gives the assistant style: its separate drafter (``DrafterParts``), read from the package of it in
the family's folder (models/gemma4/assistant/ for Gemma 4), which holds ``model_config`` (assistant_model,
assistant_stored), ``hf_mapping`` (assistant_tensors), ``hf_config`` (MODEL_TYPE, assistant_hf_config,
shape_from_hf) and ``decoder`` (assistant_model, AssistantDrafter); all but the config.json module load when first
used."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from megatron_mtp.config.lazy import lazy


@dataclass(frozen=True)
class DrafterParts:
    """A family's separate drafter. ``cfg`` is a run config."""

    model: Callable[[Any], Any]
    """cfg -> the drafter's model config (its layers, widths and the target's key widths)."""
    stored: Callable[[Any], Mapping[str, int]]
    """cfg -> the target layers whose keys/values the drafter reads (its attention kind -> decoder layer)."""
    tensors: Callable[[Any, int], list]
    """(cfg, padded vocab) -> its tensors in registration order."""
    model_type: str
    """config.json's model_type of its directory."""
    hf_config: Callable[[Any, int, str], dict]
    """(cfg, vocab, torch_dtype) -> its directory's config.json (``to-hf``)."""
    shape_from_hf: Callable[..., Any]
    """(config.json, target model config, vocab, where) -> the ``mtp.assistant`` shape it describes (``from-hf``)."""
    decoder: Callable[..., Any]
    """(config.json, its directory, target) -> its decoder module on the meta device, checked against the target (a
    TargetModel) it drafts for; inference loads its weights."""
    drafter: Callable[..., Any]
    """(the loaded decoder module, target) -> its inference/draft.py ``Drafter``."""


def family_part(package: str) -> DrafterParts:
    """The DrafterParts of the drafter package ``package``."""
    hf = importlib.import_module(f"{package}.hf_config")
    return DrafterParts(model=lazy(f"{package}.model_config:assistant_model"),
                        stored=lazy(f"{package}.model_config:assistant_stored"),
                        tensors=lazy(f"{package}.hf_mapping:assistant_tensors"), model_type=hf.MODEL_TYPE,
                        hf_config=hf.assistant_hf_config, shape_from_hf=hf.shape_from_hf,
                        decoder=lazy(f"{package}.decoder:assistant_model"),
                        drafter=lazy(f"{package}.decoder:AssistantDrafter"))
