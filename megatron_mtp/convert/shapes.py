"""Global megatron-core tensor shapes implied by a model config (for config/weights checks).

Both directions compare what they read against these shapes before writing anything, so a
config that does not describe the weights is one clear error instead of a broken output.
"""

from __future__ import annotations

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.deepseek_v3.hf_mapping import EMBEDDING, FINAL_NORM, OUTPUT_LAYER


def _suffix_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, heads = m.hidden_size, m.num_attention_heads
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    q_rank = m.q_lora_rank or 0
    return {
        "input_layernorm.weight": (h,),
        "pre_mlp_layernorm.weight": (h,),
        "self_attention.linear_q_down_proj.weight": (q_rank, h),
        "self_attention.q_layernorm.weight": (q_rank,),
        "self_attention.linear_q_up_proj.layer_norm_weight": (q_rank,),
        "self_attention.linear_q_up_proj.weight": (heads * qk, q_rank),
        "self_attention.linear_q_proj.weight": (heads * qk, h),
        "self_attention.linear_kv_down_proj.weight": (m.kv_lora_rank + m.qk_pos_emb_head_dim, h),
        "self_attention.kv_layernorm.weight": (m.kv_lora_rank,),
        "self_attention.linear_kv_up_proj.layer_norm_weight": (m.kv_lora_rank,),
        "self_attention.linear_kv_up_proj.weight": (heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank),
        "self_attention.linear_proj.weight": (h, heads * m.v_head_dim),
        "mlp.linear_fc1.layer_norm_weight": (h,),
        "mlp.linear_fc1.weight": (2 * m.ffn_hidden_size, h),
        "mlp.linear_fc2.weight": (h, m.ffn_hidden_size),
        "mlp.router.weight": (m.num_experts, h),
        "mlp.router.expert_bias": (m.num_experts,),
        "mlp.experts.experts.linear_fc1.weight": (m.num_experts, 2 * m.moe_ffn_hidden_size, h),
        "mlp.experts.experts.linear_fc2.weight": (m.num_experts, h, m.moe_ffn_hidden_size),
        "mlp.shared_experts.linear_fc1.weight": (2 * m.moe_ffn_hidden_size * m.num_shared_experts, h),
        "mlp.shared_experts.linear_fc2.weight": (h, m.moe_ffn_hidden_size * m.num_shared_experts),
        "enorm.weight": (h,),
        "hnorm.weight": (h,),
        "eh_proj.weight": (h, 2 * h),
        "final_layernorm.weight": (h,),
    }


def expected_shape(key: str, model: ModelConfig, vocab: int) -> tuple[int, ...]:
    if key in (EMBEDDING, OUTPUT_LAYER):
        return (vocab, model.hidden_size)
    if key == FINAL_NORM:
        return (model.hidden_size,)
    for suffix, shape in _suffix_shapes(model).items():
        if key.endswith("." + suffix):
            return shape
    raise KeyError(key)


def check_shape(key: str, actual: tuple[int, ...], model: ModelConfig, vocab: int, where: str) -> None:
    want = expected_shape(key, model, vocab)
    if tuple(actual) != want:
        raise UserError(
            f"'{key}' in {where} has shape {tuple(actual)} but the config implies {want} (config/weights mismatch)"
        )
