"""The config.json values every grouped-query family writes, and the model fields it reads back, the
same way (a family's hf_config.py adds its routing, MoE layer rule, MTP and refusals)."""

from __future__ import annotations

import math
from typing import Any, Optional

from megatron_mtp.models.gqa.model_config import head_dim, query_groups


def hf_values(model, *, architecture: str, model_type: str, vocab_size: int, num_nextn_predict_layers: int,
              torch_dtype: str, bos_token_id: Optional[int], eos_token_id: Optional[int],
              **own: Any) -> dict[str, Any]:
    """config.json of a grouped-query model: the shared fields, then the family's ``own`` ones in their
    order, then the closing ones (norm, rotary, positions, init, tying, tokens, dtype)."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": int(vocab_size),
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "moe_intermediate_size": model.moe_ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_nextn_predict_layers": int(num_nextn_predict_layers),
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": query_groups(model),
        "head_dim": head_dim(model),
        **own,
        "rms_norm_eps": model.norm_epsilon,
        "rope_theta": model.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": model.max_position_embeddings,
        "initializer_range": model.init_method_std,
        "tie_word_embeddings": model.tie_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": torch_dtype,
        "use_cache": True,
    }


def model_values(view) -> dict[str, Any]:
    """The model fields a grouped-query view gives, whatever the family (its routing and MoE layers aside)."""
    heads, hidden, vocab = view.num_attention_heads, view.hidden_size, view.vocab_size
    return dict(
        num_layers=view.num_hidden_layers,
        hidden_size=hidden,
        ffn_hidden_size=view.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=view.num_key_value_heads,
        head_dim=None if hidden % heads == 0 and view.head_dim == hidden // heads else view.head_dim,
        vocab_size=vocab,
        make_vocab_size_divisible_by=math.gcd(vocab, 128),
        max_position_embeddings=view.max_position_embeddings,
        rope_theta=view.rope_theta,
        moe_ffn_hidden_size=view.moe_intermediate_size,
        norm_epsilon=view.rms_norm_eps,
        init_method_std=view.initializer_range,
        tie_embeddings=view.tie_word_embeddings,
    )
