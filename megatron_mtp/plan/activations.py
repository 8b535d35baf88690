"""Bytes each layer saves for backward, per micro-batch and pipeline rank.

Every layer type is an inventory of the tensors its ops keep for backward (names in `Saved`),
sized from the config and the kernels that run (`Kernels`: the GPU plan and the CPU validation
differ only there). A decoder layer's is its family's (``Family.saved_layer``: models/<family>/activations.py,
models/gqa/activations.py, built of models/saved_activations.py's shared parts), an MTP style's own tensors its
``plan`` module's (mtp_styles/<name>/plan.py ``saved``); the embedding and the output layer are here. Recompute
settings drop or replace entries the way megatron-core 0.16.1 does:
  mla_up_proj  CheckpointWithoutOutput around the q/kv up-projections and RoPE: it keeps the
               compressed q/kv (already saved) and frees q, k, v after core attention used them;
  core_attn    checkpoints core attention: keeps q, k, v, drops the kernel's own tensors;
  layernorm    CheckpointWithoutOutput around input_layernorm and pre_mlp_layernorm (the separate
               norm modules; TE fuses a dense layer's pre-MLP norm into fc1, which is not one): keeps
               the norm input, frees its internals and its output (also the copy linears saved);
  mlp          checkpoints the dense MLP: keeps its input;  moe: the whole MoE layer, keeps its input;
  shared_experts / moe_act: the shared experts / the routed experts' activation (grouped GEMM only);
  full         a layer (or a chunk of recompute.num_layers layers) keeps only its input.
A tensor saved by two ops counts once (the same storage); a layer's input is counted by the layer
that saves it (its input norm), so a stage is the sum of its layers.

Sizes per micro-batch: T = seq × micro batch tokens; with sequence parallelism tensors outside
attention/MLP hold T/TP tokens, attention heads and MLP columns are split by TP.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from megatron_mtp.config.root import Config
from megatron_mtp.models.family import get_family
from megatron_mtp.models.saved_activations import FP32, Dims, Kernels, Saved, norm

CPU_KERNELS = Kernels(attention="sdpa_math", norm="torch", swiglu="torch", rope="torch", cross_entropy=None,
                      fp8=False, te_layers=False)


def gpu_kernels(features, fp8: bool) -> Kernels:
    """What a GPU run with Transformer Engine uses (`features` from platform.features)."""
    return Kernels(attention="flash", norm="te", swiglu="fused", rope="fused" if features.rope_fusion else "torch",
                   cross_entropy=features.cross_entropy_fusion, fp8=fp8, te_layers=True,
                   output_chunk=features.output_loss_chunk)


def cpu_kernels(features) -> Kernels:
    """What a CPU run uses (`features` from platform.features)."""
    return replace(CPU_KERNELS, output_chunk=features.output_loss_chunk)


def dims_of(cfg: Config, padded_vocab: int, imbalance: float = 1.0, seq: int | None = None,
            batch: int | None = None) -> Dims:
    m, p = cfg.model, cfg.parallel
    tp, etp = p.tensor, p.expert_tensor or p.tensor
    a = get_family(m.family).attention_shape(m)
    attention = _attention_dims(a, tp)
    # context parallelism: a rank holds 1/CP of each sequence (2 chunks); its activations scale with that
    return Dims(seq=(seq or cfg.training.seq_length) // cfg.parallel.context,
                batch=batch or cfg.training.micro_batch_size,
                hidden=m.hidden_size, heads=m.num_attention_heads // tp, **attention,
                ffn=m.ffn_hidden_size // tp, expert_ffn=m.moe_ffn_hidden_size // etp,
                shared_ffn=m.num_shared_experts * m.moe_ffn_hidden_size // tp, experts=m.num_experts,
                topk=m.router_topk, groups=m.router_num_groups or 1, vocab=padded_vocab // tp, tp=tp, etp=etp,
                act_bytes=4 if cfg.training.precision == "fp32" else 2, family=m.family, imbalance=imbalance,
                softcap=getattr(m, "final_logit_softcapping", None) is not None, cp=cfg.parallel.context)


def _attention_dims(a, tp: int) -> dict:
    return dict(qk_dim=a.qk_dim, v_dim=a.v_dim, rope_dim=a.rope_dim, q_lora=a.q_lora, kv_lora=a.kv_lora,
                kv_heads=None if a.kv_heads is None else a.kv_heads // tp, qk_norm=a.qk_norm, shares_kv=a.shares_kv,
                index_heads=a.index_heads, index_dim=a.index_dim, index_topk=a.index_topk,
                index_trains=a.index_trains)


def layer_dims(cfg: Config, d: Dims, layer: Optional[int]) -> Dims:
    """``d`` with decoder layer ``layer``'s attention (None: an MTP layer's), for a family whose layers differ."""
    shape = get_family(cfg.model.family).layer_attention_shape
    return d if shape is None else replace(d, **_attention_dims(shape(cfg.model, layer), cfg.parallel.tensor))


def decoder_layer(d: Dims, k: Kernels, modules: frozenset, moe: bool, grouped_gemm: bool) -> Saved:
    """One decoder layer without full recompute: the family's inventory (``Family.saved_layer``)."""
    return get_family(d.family).saved_layer(d, k, modules, moe, grouped_gemm)


def full_recompute_layer(d: Dims) -> Saved:
    """A layer whose whole forward is recomputed keeps its input (hidden states)."""
    out = Saved()
    out.add("layer.input", d.hidden * d.local * d.act_bytes)
    return out






def embedding(d: Dims) -> Saved:
    out = Saved()
    out.add("embedding.token_ids", d.tokens * 8)
    return out


def final_norm(d: Dims, k: Kernels) -> Saved:
    out = Saved()
    norm(out, "final_norm", d.hidden, d.local, d, k)
    return out


def heads_share_trunk(d: Dims, k: Kernels) -> bool:
    """Whether the main output layer's input is the storage the parallel heads' input norms saved already:
    the trunk output as it is (a norm that keeps its input itself; an output layer that keeps its input
    local, which the chunked loss does not under TP, gathering it)."""
    return (k.norm == "te" or d.act_bytes == FP32) and (not k.output_chunk or d.tp == 1)


def output_and_loss(d: Dims, k: Kernels, mtp_layers: int, main: bool = True, soft: bool = False,
                    trunk_saved: bool = False) -> Saved:
    """Output layer input and cross entropy of the main head (unless `main` is false: a frozen base,
    whose frozen output layer saves no input) and each MTP depth (`soft`: they learn the main model's
    distribution, mtp.targets self or mix). `trunk_saved`: the main call's input is counted by the
    parallel heads (heads_share_trunk)."""
    if k.output_chunk:
        return chunked_output_and_loss(d, mtp_layers, main, soft, trunk_saved)
    out, calls = Saved(), int(main) + mtp_layers
    if main:  # a frozen output layer (no main: the base is frozen) keeps no input for a weight gradient
        # [main; mtp] hidden states
        out.add("output_layer.input", (calls - int(trunk_saved)) * d.hidden * d.local * d.act_bytes)
    logits = d.act_bytes if k.cross_entropy else FP32  # fused: the logits gradient; unfused: fp32 softmax
    out.add("cross_entropy.logits", calls * d.tokens * d.vocab * logits)
    if d.softcap:
        out.add("softcap.tanh", calls * d.tokens * d.vocab * d.act_bytes)
    out.add("cross_entropy.targets", calls * d.tokens * 9)
    out.add("loss", calls * d.tokens * FP32)
    return out


def chunked_output_and_loss(d: Dims, mtp_layers: int, main: bool, soft: bool, trunk_saved: bool = False) -> Saved:
    """kernels.chunked_output_loss (models/chunked_output_loss.py): no logits are kept. Each output-layer
    call keeps its input whole over the sequence (all-gathered under sequence parallelism) to recompute
    its chunks in backward, and per token an fp32 log-sum-exp and the label; a self/mix depth also its
    teacher, the main hidden state rolled to it, and the teacher's log-sum-exp. With a frozen base the
    main call keeps nothing, but at TP1 the depths' inputs are views of the MTP block's one output
    tensor, which holds the main hidden state too."""
    out, calls = Saved(), int(main) + mtp_layers
    held = calls + int(not main and mtp_layers > 0 and d.tp == 1) - int(trunk_saved)
    out.add("chunked_loss.input", held * d.tokens * d.hidden * d.act_bytes)
    out.add("chunked_loss.lse", calls * d.tokens * FP32)
    out.add("chunked_loss.labels", calls * d.tokens * 8)
    if soft:
        out.add("chunked_loss.teacher", mtp_layers * d.tokens * (d.hidden * d.act_bytes + FP32))
    out.add("loss", calls * d.tokens * FP32)  # the per-token loss mask each call's loss is multiplied by
    return out
