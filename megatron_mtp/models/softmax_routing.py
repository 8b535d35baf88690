"""The routing defaults of the families whose router is a softmax top-k with a balance loss (Qwen3-MoE, Gemma 4):
the shared routing fields (config/model.py) with their values, where every other family's defaults are
DeepSeek-V3's. A family's model config derives from ``SoftmaxRouting`` beside its attention's fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from megatron_mtp.config.model import ModelConfig


@dataclass
class SoftmaxRouting(ModelConfig):
    first_k_dense: int = 0
    """The first k decoder layers use a dense MLP (softmax-routed families: 0)."""
    num_shared_experts: int = 0
    """Shared experts per MoE layer (none)."""
    router_num_groups: Optional[int] = None
    """Expert groups for group-limited routing (null: no grouping)."""
    router_group_topk: Optional[int] = None
    """Groups each token may route into (null)."""
    router_score_function: Literal["sigmoid", "softmax"] = "softmax"
    """Router score function: softmax over all experts, then the top k."""
    router_topk_scaling_factor: float = 1.0
    """Scale of the combined top-k weights (none, 1.0)."""
    router_enable_expert_bias: bool = False
    """Aux-loss-free expert bias (none: these routers balance with the auxiliary loss)."""
    aux_loss_coeff: float = 1.0e-3
    """Balance loss weight (Qwen3-MoE's router_aux_loss_coef 0.001; 0 disables it)."""
    aux_loss_type: Literal["seq_aux_loss", "aux_loss", "global_aux_loss"] = "aux_loss"
    """Over which tokens the balance loss counts (the micro-batch, as transformers computes it)."""
