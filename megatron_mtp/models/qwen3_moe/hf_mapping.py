"""THE tensor table of the Qwen3-MoE family (``qwen3_moe``): the grouped-query attention rules
(models/gqa/hf_mapping.py; Qwen3 always has the q/k norms and never the bias) around the shared
MoE, dense MLP and MTP rules (models/tensor_table.py), and Qwen3's MTP naming.

The MTP naming. The Qwen3-MoE releases ship no MTP module, so the names are those of the one engine
that loads an MTP draft for ``Qwen3MoeForCausalLM``: SGLang's ``Qwen3MoeForCausalLMMTP`` (the
Qwen3-Next spelling), which reads from the target's directory
  ``mtp.pre_fc_norm_embedding.weight`` (our enorm), ``mtp.pre_fc_norm_hidden.weight`` (hnorm),
  ``mtp.fc.weight`` (eh_proj, over [embedding; hidden] as ours), ``mtp.layers.0.*`` (the decoder layer,
  under Qwen3-MoE's names), ``mtp.norm.weight`` (shared_head.norm),
and shares the target's embedding and output head (no copies are written). It runs one module; module
d >= 1 of a deeper checkpoint goes under ``mtp.{d}.`` with the same sub-names, which SGLang skips and
``megatron-mtp generate`` reads.
"""

from __future__ import annotations

import re
from typing import Optional

from megatron_mtp.models.gqa.hf_mapping import ATTENTION_ORDER, ATTENTION_RULES, attention_rules  # noqa: F401
from megatron_mtp.models.tensor_table import Table

MTP_OWN_NAMES = {
    "enorm.weight": "pre_fc_norm_embedding.weight",
    "hnorm.weight": "pre_fc_norm_hidden.weight",
    "eh_proj.weight": "fc.weight",
    "shared_head.norm.weight": "norm.weight",
}
"""Our (the release's) MTP-own sub-names -> Qwen3's."""
_NOT_WRITTEN = ("embed_tokens.weight", "shared_head.head.weight")
_RELEASE = re.compile(r"model\.layers\.(\d+)\.(.+)")


def mtp_prefix(depth: int) -> str:
    """Where MTP module ``depth`` (0-based) lives: ``mtp.`` for the one SGLang runs, ``mtp.{d}.`` after it."""
    return "mtp." if depth == 0 else f"mtp.{depth}."


def mtp_name(name: str, num_layers: int) -> Optional[str]:
    """The Qwen3 name of an MTP tensor given by its release name ``model.layers.{num_layers + d}.*``;
    None for the embedding and head copies, which are not written."""
    match = _RELEASE.fullmatch(name)
    if match is None or int(match.group(1)) < num_layers:
        raise ValueError(f"{name} is not an MTP tensor of a {num_layers}-layer model")
    prefix, rest = mtp_prefix(int(match.group(1)) - num_layers), match.group(2)
    if rest in _NOT_WRITTEN:
        return None
    return prefix + MTP_OWN_NAMES.get(rest, "layers.0." + rest)


TABLE = Table(attention=ATTENTION_RULES, attention_for=attention_rules, mtp_names=mtp_name)
