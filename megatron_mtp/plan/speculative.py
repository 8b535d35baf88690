"""Does MTP speculative decoding pay for this model, at this batch, on this GPU? A prediction.

Design note. Decoding is memory-bound: a forward's time is the bytes it reads over the GPU's memory
bandwidth. A forward over T tokens reads every dense weight once (attention, norms, router, shared
experts, dense MLPs, the output head), the routed experts that at least one token picks, and the KV
cache of every sequence. Under uniform routing with top-k of E experts, T tokens touch
E·(1−(1−k/E)^T) distinct experts per MoE layer (a measured count can replace it). Plain decoding
commits one token per sequence per forward of B tokens. A speculative round runs K draft steps (the
MTP module: one layer, eh_proj and the head, B tokens each) and one verify forward of B·(K+1) tokens,
and commits 1 + a₁ + a₁a₂ + … + a₁…a_K tokens per sequence (a_i: acceptance at draft depth i). The
speedup is tokens per second of speculative over plain decoding. An assistant (mtp.style assistant, Gemma 4)
drafts instead: each step reads all its own weights (its output table, of its width, the bulk of them) and, in
every one of its layers, the target's stored keys/values of that layer's kind for every sequence (a sliding
layer's window of them); it reads no expert, and with centroids (mtp.assistant.num_centroids) only the table
rows of its top clusters' tokens (for one sequence: the union over a batch is not modelled). A style with a drafter of
its own counts a draft step's bytes itself (its plan's ``draft_step_bytes``: EAGLE-3's small dense layers, its head
over the draft vocabulary, its own keys and values).

A forward takes the longer of its memory time and its compute time at the GPU's dense peak (FP8
peak for 1-byte weights), so large batches meet the compute roof. Assumptions, printed with the
table: no launch or communication overhead; no
expert caching between forwards; the serving layout splits dense weights and the KV cache over its
TP ranks and the routed experts evenly over its EP ranks; weights at --weight-bytes per element
(1: the FP8 release), KV cache in bf16; every sequence has --context tokens cached.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_mtp.config import Config
from megatron_mtp.config.mtp_style import get_style, style_names
from megatron_mtp.errors import UserError
from megatron_mtp.models.expert_reach import distinct_experts
from megatron_mtp.models.family import get_family
from megatron_mtp.models.sizes import assistant_weights, mtp_own_size
from megatron_mtp.models.tensor_table import moe_layer_count, mtp_is_moe
from megatron_mtp.platform.gpus import Gpu

BATCHES = (1, 2, 4, 8, 16, 64, 256)
DRAFTS = (1, 2, 3)


@dataclass(frozen=True)
class ForwardBytes:
    dense: float
    experts: float
    kv: float
    flops: float = 0.0
    """Matmul and attention FLOPs of the forward on one GPU (for the compute roof)."""

    @property
    def total(self) -> float:
        return self.dense + self.experts + self.kv

    def seconds(self, gpu: Gpu, fp8: bool) -> float:
        """The roofline: memory time, or compute time where the forward is compute-bound."""
        peak = (gpu.fp8_tflops if fp8 else gpu.bf16_tflops) * 1e12
        return max(self.total / gpu.hbm_bytes_per_s, self.flops / peak if peak else 0.0)


@dataclass(frozen=True)
class ServeLayout:
    tp: int = 1
    ep: int = 1
    weight_bytes: float = 1.0
    kv_bytes: float = 2.0
    context: int = 4096


def _attention_flops(cfg: Config, serve: ServeLayout) -> float:
    """One token's attention scores and values over the cache, in one layer (the family's attention)."""
    return get_family(cfg.model.family).decode_attention_flops(cfg, serve.context)


def main_forward_bytes(cfg: Config, padded_vocab: int, batch: int, tokens: int, serve: ServeLayout,
                       experts_touched: float | None = None) -> ForwardBytes:
    """Bytes one GPU reads in a main-model forward of `tokens` tokens over `batch` sequences."""
    family, m = get_family(cfg.model.family), cfg.model
    s = family.layer_sizes(cfg)
    moe = moe_layer_count(m)
    dense_layers = m.num_layers - moe
    dense = (m.num_layers * (s.attention + s.norms) + dense_layers * s.dense_mlp + moe * s.around_experts
             + m.hidden_size + padded_vocab * m.hidden_size)  # final norm, output head
    touched = distinct_experts(m.num_experts, m.router_topk, tokens) if experts_touched is None else experts_touched
    kv = batch * serve.context * m.num_layers * family.kv_cache_elements_per_token(cfg, serve.context) * serve.kv_bytes
    # per token: 2 FLOPs per dense weight and per weight of its top-k experts, and attention over the cache
    flops = tokens * (2 * dense + 2 * moe * m.router_topk * s.expert + m.num_layers * _attention_flops(cfg, serve))
    return ForwardBytes(dense=dense * serve.weight_bytes / serve.tp,
                        experts=moe * touched * s.expert * serve.weight_bytes / serve.ep,
                        kv=kv / serve.tp, flops=flops / max(serve.tp, serve.ep))


def draft_step_bytes(cfg: Config, padded_vocab: int, batch: int, serve: ServeLayout) -> ForwardBytes:
    """Bytes one GPU reads in one draft step of the MTP module (its layer, own tensors and the head)."""
    family, m = get_family(cfg.model.family), cfg.model
    s = family.layer_sizes(cfg)
    moe = mtp_is_moe(m)
    mlp = s.around_experts if moe else s.dense_mlp
    dense = s.attention + s.norms + mlp + mtp_own_size(cfg) + padded_vocab * m.hidden_size
    touched = distinct_experts(m.num_experts, m.router_topk, batch) if moe else 0.0
    cached = family.mtp_kv_cache_elements_per_token or family.kv_cache_elements_per_token  # the MTP layer's own
    kv = batch * serve.context * cached(cfg, serve.context) * serve.kv_bytes
    flops = batch * (2 * dense + (2 * m.router_topk * s.expert if moe else 0) + _attention_flops(cfg, serve))
    return ForwardBytes(dense=dense * serve.weight_bytes / serve.tp,
                        experts=touched * s.expert * serve.weight_bytes / serve.ep, kv=kv / serve.tp,
                        flops=flops / max(serve.tp, serve.ep))


def assistant_step_bytes(cfg: Config, padded_vocab: int, batch: int, serve: ServeLayout) -> ForwardBytes:
    """Bytes one GPU reads in one draft step of a separate drafter (module note)."""
    family = get_family(cfg.model.family)
    weights, drafter = assistant_weights(family, cfg, padded_vocab)  # its layers, the target's key widths
    a = cfg.mtp.assistant
    if a.num_centroids:  # a centroid-masked output reads the rows of its top clusters' tokens alone
        weights -= (padded_vocab - a.centroid_top_k * (padded_vocab // a.num_centroids)) * a.hidden_size
    layers = drafter.model.num_layers
    kv = batch * serve.context * layers * family.kv_cache_elements_per_token(drafter, serve.context) * serve.kv_bytes
    flops = batch * (2 * weights + layers * family.decode_attention_flops(drafter, serve.context))
    return ForwardBytes(dense=weights * serve.weight_bytes / serve.tp, experts=0.0, kv=kv / serve.tp,
                        flops=flops / serve.tp)


def tokens_per_round(acceptance: list[float], drafts: int) -> float:
    """Committed tokens per sequence per round: 1 + a₁ + a₁a₂ + … (the last given rate repeats)."""
    total, chain = 1.0, 1.0
    for i in range(drafts):
        chain *= acceptance[min(i, len(acceptance) - 1)]
        total += chain
    return total


@dataclass(frozen=True)
class Prediction:
    batch: int
    drafts: int
    plain_ms: float
    round_ms: float
    tokens_per_round: float
    verify_experts: float
    plain_experts: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_round * self.plain_ms / self.round_ms


def check_serve_layout(cfg: Config, serve: ServeLayout) -> None:
    """The serving layout must be one an engine can build: whole experts per expert-parallel GPU and
    whole attention heads (and key/value heads, or copies of them) per tensor-parallel GPU."""
    m = cfg.model
    if serve.ep > 1 and not m.num_experts:
        raise UserError(f"--serve-ep is {serve.ep} and this model has no routed experts; use --serve-ep 1")
    if m.num_experts and m.num_experts % serve.ep:
        raise UserError(f"--serve-ep {serve.ep} does not divide the model's {m.num_experts} routed experts; give a "
                        f"divisor of {m.num_experts} (every expert-parallel GPU holds whole experts)")
    if m.num_attention_heads % serve.tp:
        raise UserError(f"--serve-tp {serve.tp} does not divide the model's {m.num_attention_heads} attention heads; "
                        f"give a divisor of {m.num_attention_heads}")
    kv = get_family(m.family).attention_shape(m).kv_heads
    if kv is not None:  # grouped-query: whole key/value heads per GPU, or copies of them
        if kv % serve.tp and serve.tp % kv:
            raise UserError(f"--serve-tp {serve.tp} neither divides the model's {kv} key/value heads nor is a "
                            f"multiple of them (which engines serve by copying each); give a divisor or a multiple "
                            f"of {kv}")


def predict(cfg: Config, padded_vocab: int, gpu: Gpu, acceptance: list[float], serve: ServeLayout,
            batches=BATCHES, drafts=DRAFTS) -> list[Prediction]:
    style = get_style(cfg.mtp.style)
    if not cfg.mtp.num_layers or not style.drafts:
        raise UserError("the speculative prediction needs a drafter; set mtp.num_layers ≥ 1 with "
                        f"mtp.style={style_names('drafts')}")
    if not gpu.hbm_bytes_per_s:
        raise UserError(f"the memory bandwidth of '{gpu.name}' is unknown; use --gpu h100, h200 or b200")
    if not acceptance or any(not 0.0 <= a <= 1.0 for a in acceptance):
        raise UserError(f"--acceptance {acceptance} must be rates between 0 and 1 (e.g. 0.85 or 0.9,0.8,0.7)")
    check_serve_layout(cfg, serve)
    out = []
    m = cfg.model
    fp8 = serve.weight_bytes <= 1
    for b in batches:
        plain = main_forward_bytes(cfg, padded_vocab, b, b, serve)
        for k in drafts:
            verify = main_forward_bytes(cfg, padded_vocab, b, b * (k + 1), serve)
            draft = style.plan().draft_step_bytes(cfg, padded_vocab, b, serve)
            out.append(Prediction(
                batch=b, drafts=k, plain_ms=plain.seconds(gpu, fp8) * 1e3,
                round_ms=(verify.seconds(gpu, fp8) + k * draft.seconds(gpu, fp8)) * 1e3,
                tokens_per_round=tokens_per_round(acceptance, k),
                verify_experts=distinct_experts(m.num_experts, m.router_topk, b * (k + 1)),
                plain_experts=distinct_experts(m.num_experts, m.router_topk, b)))
    return out


def format_table(cfg: Config, gpu: Gpu, acceptance: list[float], serve: ServeLayout,
                 rows: list[Prediction]) -> str:
    m = cfg.model
    lines = [
        f"speculative decoding with {get_style(cfg.mtp.style).drafter_words} on "
        f"{gpu.name} ({gpu.hbm_bytes_per_s / 1e12:.2f} TB/s), "
        f"serving layout TP{serve.tp} × EP{serve.ep}, weights {serve.weight_bytes:g} B/element, "
        f"{serve.context} cached tokens per sequence, acceptance {', '.join(f'{a:.2f}' for a in acceptance)}",
        "assumed: roofline forwards (bytes/bandwidth or FLOPs/peak), no launch or communication time, no expert "
        "caching, uniform routing "
        f"(E={m.num_experts}, top-{m.router_topk}), dense weights and KV cache split over TP, experts over EP",
        f"{'batch':>5} {'K':>2} {'experts/layer plain→verify':>27} {'plain ms':>9} {'round ms':>9} "
        f"{'tokens/round':>12} {'speedup':>8}",
    ]
    for r in rows:
        lines.append(f"{r.batch:>5} {r.drafts:>2} {r.plain_experts:>12.1f} → {r.verify_experts:<12.1f} "
                     f"{r.plain_ms:>9.3f} {r.round_ms:>9.3f} {r.tokens_per_round:>12.2f} {r.speedup:>7.2f}x")
    return "\n".join(lines)
