"""The EAGLE-3 drafter as a megatron-core module: ``fc`` (the target's aux hidden states, concatenated -> hidden),
its decoder layers (layer.py), ``final_layernorm`` and ``lm_head`` over the draft vocabulary, with the vocabulary
tables ``d2t`` / ``t2d`` as buffers (vocab.py). Checkpoint keys ``mtp_eagle3.*``.

Its K steps (``forward``) over the whole sequence at once (layer.py's note says which keys each step sees):

    h_0(t) = fc([a_1(t) ; ... ; a_n(t)])                        the target's aux hidden states at t
    x_k(t) = L([E(x_{t+1+k}) ; h_k(t)])  at position t + 1 + k    E: the target's (frozen) embedding
    logits_k(t) = lm_head(norm(x_k(t)))                         over the draft vocabulary
    h_{k+1}(t) = x_k(t)   (norm(x_k(t)) with norm_output)

so step k at anchor t predicts the token t + 2 + k, where the target's own distribution at t + 1 + k is its
teacher (model.py). The token embeddings are handed in, looked up in the target's table: the drafter holds none.
"""

from __future__ import annotations

import copy

import torch
from megatron.core.transformer.module import MegatronModule

from megatron_mtp.mtp_styles.eagle3.layer import DraftLayer, rotary_tables
from megatron_mtp.mtp_styles.eagle3.shape import DrafterShape
from megatron_mtp.mtp_styles.eagle3.shards import sequence_split


def drafter_config(shape: DrafterShape, target_config):
    """The drafter's TransformerConfig: the target's (precision, init, parallel groups) with the drafter's heads
    and SwiGLU MLP, no experts, no biases."""
    import torch.nn.functional as F

    out = copy.copy(target_config)
    out.num_attention_heads, out.num_query_groups, out.kv_channels = shape.heads, shape.groups, shape.head_dim
    out.ffn_hidden_size, out.num_layers, out.mtp_num_layers = shape.ffn, shape.num_layers, None
    out.num_moe_experts, out.moe_layer_freq = None, 1
    out.gated_linear_unit, out.activation_func, out.add_bias_linear = True, F.silu, False
    out.bias_activation_fusion = False
    return out


class Eagle3Drafter(MegatronModule):
    """``fc``, ``layers``, ``final_layernorm``, ``lm_head`` and the ``d2t`` / ``t2d`` buffers (module note)."""

    def __init__(self, shape: DrafterShape, target_config):
        from megatron.core.tensor_parallel import ColumnParallelLinear

        from megatron_mtp.platform.local_modules import RMSNorm

        config = drafter_config(shape, target_config)
        super().__init__(config=config)
        self.shape = shape
        h = shape.hidden
        linear = dict(config=config, init_method=config.init_method, bias=False, gather_output=True)
        self.fc = ColumnParallelLinear(len(shape.aux_layers) * h, h, **linear)
        self.layers = torch.nn.ModuleList(
            DraftLayer(config, i == 0, shape.heads, shape.groups, shape.head_dim, shape.norm_before_residual)
            for i in range(shape.num_layers))
        self.final_layernorm = RMSNorm(config, h, shape.eps)
        self.lm_head = ColumnParallelLinear(h, shape.draft_vocab, **linear)
        self.lm_head.weight.requires_grad_(shape.train_lm_head)
        # the draft vocabulary (vocab.py): d2t[i] = target id of draft index i minus i; t2d[v]: v is drafted.
        # All zero until a new drafter picks its vocabulary (model.py prepare_after_load) or loads it.
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(shape.vocab, dtype=torch.bool))

    @property
    def has_vocabulary(self) -> bool:
        """Its draft vocabulary is set (picked, or loaded with its weights)."""
        return bool(self.t2d.any())

    @property
    def draft_ids(self) -> torch.Tensor:
        """[draft vocab] the target id of each draft index."""
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None):
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint, sharded_state_dict_default

        own: dict = {}
        self._save_to_state_dict(own, "", keep_vars=True)  # its buffers (d2t, t2d), replicated
        out = make_sharded_tensors_for_checkpoint(own, prefix, sharded_offsets=sharded_offsets)
        for name, module in self.named_children():
            if name == "layers":  # each layer shards itself (a plain ModuleList would be saved replicated)
                for i, layer in enumerate(module):
                    out.update(sharded_state_dict_default(layer, f"{prefix}layers.{i}.", sharded_offsets, metadata))
            else:
                out.update(sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets, metadata))
        return out

    def forward(self, aux: torch.Tensor, embeddings: list[torch.Tensor], positions: torch.Tensor) -> list[torch.Tensor]:
        """The final-normed output [s, b, hidden] of each of the ``len(embeddings)`` steps (module note). ``aux``
        [s, b, n·hidden]: the target's aux hidden states concatenated; ``embeddings``: step k's token embeddings
        [s, b, hidden] (the tokens t + 1 + k); ``positions`` [b, s]: step 0's rotary positions, of the whole
        sequence. Under sequence parallelism s is this rank's chunk of it in ``aux``, ``embeddings`` and the
        outputs (shards.py)."""
        # fc's output is gathered whole: this rank's sequence chunk under sequence parallelism (shards.py)
        hidden = sequence_split(self.fc(aux.to(self.fc.weight.dtype))[0], self.config.sequence_parallel)
        caches: list[list] = [[] for _ in self.layers]
        outputs = []
        for k, embedding in enumerate(embeddings):
            cos, sin = rotary_tables(positions + k, self.shape.head_dim, self.shape.rope_theta)
            x = torch.cat([embedding.to(hidden.dtype), hidden], dim=-1)
            for layer, cache in zip(self.layers, caches):
                x = layer(x, cos, sin, cache)
            normed = self.final_layernorm(x)
            outputs.append(normed)
            hidden = normed if self.shape.norm_output else x
        return outputs

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[s, b, draft vocab] logits of a step's output (the whole sequence and draft vocabulary on every TP
        rank)."""
        return self.lm_head(x)[0]
