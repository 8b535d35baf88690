"""Global megatron-core tensor shapes implied by a model config (for config/weights checks).

Both directions compare what they read against these shapes before writing anything, so a
config that does not describe the weights is one clear error instead of a broken output. The
shapes come from the model family's tensor table (models/<family>/hf_mapping.py); routed experts get
their leading global-expert axis here, as the checkpoint stores them.
"""

from __future__ import annotations

from typing import Mapping, Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import get_family
from megatron_mtp.models.tensor_table import EMBEDDING, OUTPUT_LAYER


def expected_shape(key: str, model: ModelConfig, vocab: int,
                   drafter: Optional[Mapping[str, tuple[int, ...]]] = None) -> tuple[int, ...]:
    """The global shape of ``key``: the family's table, or ``drafter`` (a separate drafter's own tensors, its MTP
    style's ``convert.drafter_shapes``)."""
    if drafter and key in drafter:
        return tuple(drafter[key])
    if key in (EMBEDDING, OUTPUT_LAYER):
        return (vocab, model.hidden_size)
    rule = get_family(model.family).table.rule_for_key(key, model)
    shape = tuple(rule.shape(model))
    return (model.num_experts, *shape) if rule.experts else shape


def check_shape(key: str, actual: tuple[int, ...], model: ModelConfig, vocab: int, where: str,
                drafter: Optional[Mapping[str, tuple[int, ...]]] = None) -> None:
    want = expected_shape(key, model, vocab, drafter)
    if tuple(actual) != want:
        raise UserError(
            f"'{key}' in {where} has shape {tuple(actual)} but the config implies {want} (config/weights mismatch)"
        )
