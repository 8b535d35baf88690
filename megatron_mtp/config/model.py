"""Model architecture: a DeepSeek-V3-style decoder (MLA or, family glm4_moe, grouped-query
attention; DeepSeek MoE) with an MTP block.

Names follow the DeepSeek-V3 paper / HF config where they differ from megatron-core, and the
mapping to megatron-core's TransformerConfig lives in models/megatron_config.py and each family's
transformer_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class YarnConfig:
    factor: float = 1.0
    """RoPE scaling factor (1.0 disables YaRN: plain RoPE)."""
    original_max_position_embeddings: int = 4096
    """Context length the rotary frequencies were designed for before YaRN stretching."""
    beta_fast: float = 32.0
    """YaRN high-frequency boundary (in rotations)."""
    beta_slow: float = 1.0
    """YaRN low-frequency boundary (in rotations)."""
    mscale: float = 1.0
    """YaRN attention-magnitude scale coefficient."""
    mscale_all_dim: float = 1.0
    """YaRN magnitude coefficient applied to all dimensions (DeepSeek-V3 uses 1.0)."""


@dataclass
class ModelConfig:
    family: Literal["deepseek_v3", "glm4_moe"] = "deepseek_v3"
    """Model family (models/<family>/): its layers, tensor names and Hugging Face format. deepseek_v3:
    MLA attention (the MLA fields below); glm4_moe: GLM-4.5's grouped-query attention (the GQA fields
    below; the MLA fields are ignored). Both share the MoE and MTP fields. Recorded in every
    checkpoint; a resume can't change it. models/README.md says how a family is added."""
    num_layers: int = 4
    """Number of main-model decoder layers (MTP layers are extra, see mtp.num_layers)."""
    hidden_size: int = 128
    """Model width d."""
    ffn_hidden_size: int = 384
    """Intermediate size of the dense (first-k) layers' SwiGLU MLP."""
    num_attention_heads: int = 4
    """Attention heads."""
    vocab_size: Optional[int] = None
    """Vocabulary size; null takes it from the tokenizer (then padded, see make_vocab_size_divisible_by)."""
    make_vocab_size_divisible_by: int = 64
    """Pad the embedding/output rows to a multiple of this times tensor parallel size."""
    max_position_embeddings: int = 4096
    """Largest position the model is meant to serve (recorded in exported configs)."""
    # --- grouped-query attention (family glm4_moe; refused with deepseek_v3)
    num_query_groups: Optional[int] = None
    """Key/value heads (HF num_key_value_heads); each serves num_attention_heads / num_query_groups
    query heads. null: as many as attention heads."""
    head_dim: Optional[int] = None
    """Width of each query/key/value head (HF head_dim). null: hidden_size / num_attention_heads."""
    rotary_percent: Optional[float] = None
    """Share of each head's dimensions that RoPE rotates: the first head_dim x this, rotate-half
    style (HF partial_rotary_factor). null: 0.5, GLM-4.5's."""
    qk_layernorm: bool = False
    """An RMSNorm of width head_dim on each query and key head before RoPE (HF use_qk_norm)."""
    add_qkv_bias: bool = False
    """A bias on the query, key and value projections, never on the output one (HF attention_bias)."""
    rope_theta: float = 10000.0
    """RoPE base (both families)."""
    # --- MLA (family deepseek_v3; ignored by glm4_moe, which refuses YaRN)
    q_lora_rank: Optional[int] = 64
    """Rank of the query down-projection (null: full-rank queries, as in DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 32
    """Rank of the compressed key/value latent."""
    qk_head_dim: int = 32
    """Per-head query/key dimension without the rotary part (HF qk_nope_head_dim)."""
    qk_pos_emb_head_dim: int = 16
    """Per-head decoupled rotary dimension (HF qk_rope_head_dim)."""
    v_head_dim: int = 32
    """Per-head value dimension."""
    yarn: YarnConfig = field(default_factory=YarnConfig)
    """YaRN context-extension parameters."""
    # --- MoE
    num_experts: int = 8
    """Routed experts per MoE layer (0: dense model)."""
    first_k_dense: int = 1
    """The first k decoder layers use a dense MLP instead of MoE (HF first_k_dense_replace)."""
    moe_ffn_hidden_size: int = 96
    """Intermediate size of each routed expert."""
    num_shared_experts: int = 1
    """Shared experts per MoE layer (their combined intermediate size is this × moe_ffn_hidden_size)."""
    router_topk: int = 2
    """Routed experts per token."""
    router_num_groups: Optional[int] = 4
    """Expert groups for group-limited routing (null: no grouping)."""
    router_group_topk: Optional[int] = 2
    """Groups each token may route into (needs router_num_groups)."""
    router_score_function: Literal["sigmoid", "softmax"] = "sigmoid"
    """Router score function; DeepSeek-V3 uses sigmoid."""
    router_topk_scaling_factor: float = 2.5
    """Routed scaling factor applied to the combined top-k weights."""
    router_norm_topk_prob: bool = True
    """Normalise the selected top-k sigmoid scores to sum to one (DeepSeek-V3: true)."""
    router_enable_expert_bias: bool = True
    """Aux-loss-free load balancing: a per-expert bias on routing scores, updated every step."""
    router_bias_update_rate: float = 1.0e-3
    """Step size of the expert-bias update."""
    aux_loss_coeff: float = 1.0e-4
    """Sequence-level auxiliary balance loss weight (0 disables it)."""
    # --- misc
    norm_epsilon: float = 1.0e-6
    """RMSNorm epsilon."""
    init_method_std: float = 0.02
    """Std of the normal weight initialisation."""
    tie_embeddings: bool = False
    """Share the input embedding with the output head (DeepSeek-V3: false)."""


def gqa_head_dim(m: ModelConfig) -> int:
    """Grouped-query attention's head width: model.head_dim, else hidden_size / num_attention_heads."""
    return m.head_dim or m.hidden_size // m.num_attention_heads


def gqa_query_groups(m: ModelConfig) -> int:
    """Key/value groups: model.num_query_groups, else one per query head."""
    return m.num_query_groups or m.num_attention_heads


def gqa_rotary_percent(m: ModelConfig) -> float:
    """The share of each head RoPE rotates: model.rotary_percent, else GLM-4.5's 0.5."""
    return 0.5 if m.rotary_percent is None else m.rotary_percent


@dataclass
class MTPConfig:
    num_layers: int = 1
    """MTP depth D: D modules (style sequential) or D heads (style parallel) predicting tokens
    t+2 .. t+1+D (0 disables MTP)."""
    style: Literal["sequential", "parallel"] = "sequential"
    """sequential: DeepSeek-V3's chained modules (depth k also reads the embedding of token t+k);
    parallel: Gloeckle et al.'s independent heads, one decoder layer each on the trunk's last hidden
    state, sharing the output layer (models/deepseek_v3/parallel_heads.py)."""
    repeated_layer: bool = False
    """One MTP module applied mtp.num_layers times (megatron-core 0.19's mtp_use_repeated_layer; refused on
    0.16): depth k reads depth k-1's output and the embedding of token t+k exactly as D modules would, but
    the D depths share one module's weights, gradients and optimizer state. Style sequential only.
    Checkpoints hold that one module (``mtp.layers.0``); exports write it as one MTP layer
    (``num_nextn_predict_layers: 1``) and SERVING.md asks for D draft tokens, which vLLM and SGLang draw
    by applying the one module again, as `generate --speculative D` does."""
    init: Literal["random", "copy_last_layer"] = "random"
    """MTP modules a checkpoint.load (weights only) does not hold, e.g. of a model imported without
    MTP: drawn at random like a new run's, or their transformer layer copied from the checkpoint's
    last decoder layer (their norms and eh_proj are new either way)."""
    freeze_base: bool = False
    """Train only the MTP modules on a frozen main model (needs checkpoint.load and mtp.num_layers > 0,
    style sequential): every other parameter, the shared embedding and output head included, gets no
    gradient, no optimizer state and no place in the DDP buckets; the main model runs forward only
    (no saved activations; pipeline stages without an MTP layer do no backward at all) and its weights,
    router expert biases included, are saved exactly as loaded. Gradients are reduced once after the
    last micro-batch (parallel.overlap_grad_reduce / overlap_param_gather do not apply: there is no
    base backward to overlap with). A new run loads only the weights of checkpoint.load (its optimizer
    state and progress belong to other parameters, whatever checkpoint.load_optimizer says); resuming the
    run's own checkpoint restores everything. training/README.md, "Frozen base"."""
    targets: Literal["tokens", "self", "mix"] = "tokens"
    """What MTP depth k at position i learns: tokens, the data token i+1+k (cross-entropy); self, the main
    model's own next-token distribution at position i+k from the same forward (detached,
    temperature-scaled by self_temperature; cross-entropy to it, i.e. KL plus the teacher's entropy),
    which is what a greedy verifier accepts; mix, (1 - self_weight)·tokens + self_weight·self."""
    self_weight: float = 0.5
    """With targets=mix: the weight of the self-distillation term (0..1)."""
    self_temperature: float = 1.0
    """With targets self or mix: temperature T of the main model's distribution softmax(logits / T)."""
    head_by_head_backward: bool = False
    """Style parallel: forward and backward one head at a time through the detached trunk output
    (Gloeckle et al.'s memory-saving order), so one head's activations and logits are alive at a time."""
    loss_weight_schedule: list[tuple[int, float]] = field(default_factory=lambda: [(0, 0.3)])
    """λ by consumed training tokens: [[tokens, λ], ...]; λ of the last entry whose start ≤ tokens
    consumed applies. DeepSeek-V3: [[0, 0.3], [10e12, 0.1]]. The objective is lm + (λ/D)·Σ_d CE_d."""

    @property
    def modules(self) -> int:
        """How many MTP modules hold weights: 1 with repeated_layer, else num_layers (the depth)."""
        return min(self.num_layers, 1) if self.repeated_layer else self.num_layers
