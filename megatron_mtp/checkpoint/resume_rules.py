"""Which config fields a resume may change, and the refusal when one that may not has changed.

Design note. A checkpoint's tensors and token ids mean something only under the config that wrote
them: the model's shape and MoE layout, the MTP depth and style, the vocabulary and the tokenizer.
Resuming a run directory with any of those changed either ends deep inside megatron-core (a missing
key, a global shape mismatch) or, worse, trains on (a new tokenizer maps the same ids to other
text) and lets `keep_last` delete the good checkpoints. So before any process group starts, the
trainer compares these fields with the checkpoint's recorded config and refuses the resume in one
sentence. Everything else may change on resume: the parallel layout (checkpoints reshard), the
schedule and learning rate, intervals, recompute and the other memory and speed controls, the loss
weights, the data blend, the router's bias update rate and the aux-loss coefficient. mtp.freeze_base
may not change either: the optimizer state holds the MTP parameters alone, or every parameter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron_mtp.config import Config
from megatron_mtp.config.vocab import padded_vocab_size
from megatron_mtp.errors import UserError

MEANING = (
    # the shapes of the tensors and what the layers compute
    "model.family", "model.num_layers", "model.hidden_size", "model.ffn_hidden_size", "model.num_attention_heads",
    "model.q_lora_rank", "model.kv_lora_rank", "model.qk_head_dim", "model.qk_pos_emb_head_dim", "model.v_head_dim",
    "model.rope_theta", "model.yarn", "model.norm_epsilon", "model.tie_embeddings",
    # grouped-query attention (glm4_moe)
    "model.num_query_groups", "model.head_dim", "model.rotary_percent", "model.qk_layernorm", "model.add_qkv_bias",
    # the MoE layout and routing
    "model.num_experts", "model.first_k_dense", "model.moe_ffn_hidden_size", "model.num_shared_experts",
    "model.router_topk", "model.router_num_groups", "model.router_group_topk", "model.router_score_function",
    "model.router_topk_scaling_factor", "model.router_norm_topk_prob", "model.router_enable_expert_bias",
    # the MTP modules
    "mtp.num_layers", "mtp.style", "mtp.repeated_layer",
    # what token ids mean
    "model.vocab_size", "data.tokenizer", "data.default_corpus_vocab_size",
)
"""Config fields whose change makes a checkpoint mean something else (docs: README.md, "Checkpoints and resume")."""


def _field(cfg: Config, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value.__dict__ if hasattr(value, "__dataclass_fields__") else value


def meaning_changes(saved: Config, now: Config) -> list[str]:
    """'FIELD is A in the checkpoint and B now' for each field of MEANING that differs, and the padded
    vocabulary when only the padding rule changed it."""
    changes = [f"{name} is {_field(saved, name)!r} in the checkpoint and {_field(now, name)!r} now"
               for name in MEANING if _field(saved, name) != _field(now, name)]
    if not changes and saved.model.vocab_size is not None and now.model.vocab_size is not None:
        before, after = padded_vocab_size(saved.model.vocab_size, saved), padded_vocab_size(now.model.vocab_size, now)
        if before != after:
            changes.append(f"the padded vocabulary is {before} in the checkpoint and {after} now "
                           "(model.make_vocab_size_divisible_by or the tensor-parallel size)")
    return changes


def refuse_meaning_changes(saved: Config, now: Config, step_dir: Path, run_dir: Path) -> None:
    """One sentence naming every changed field with both values, and the two ways out."""
    if saved.mtp.freeze_base != now.mtp.freeze_base:  # the optimizer state covers other parameters
        raise UserError(f"cannot resume {run_dir} from {step_dir.name}: mtp.freeze_base is {saved.mtp.freeze_base} "
                        f"in the checkpoint and {now.mtp.freeze_base} now, and its optimizer state holds "
                        f"{'the MTP parameters alone' if saved.mtp.freeze_base else 'every parameter'}; keep it to "
                        f"resume, or start a new run from these weights with --run-dir NEW "
                        f"checkpoint.load={step_dir} checkpoint.load_optimizer=false")
    changes = meaning_changes(saved, now)
    if changes:
        raise UserError(f"cannot resume {run_dir} from {step_dir.name}: {'; '.join(changes)}, which changes what "
                        f"the checkpoint's weights or token ids mean; keep those values to resume, or train the "
                        f"new config elsewhere with --run-dir, or start a new run from these weights with "
                        f"--run-dir NEW checkpoint.load={step_dir} checkpoint.load_optimizer=false")
