"""The assistant as a megatron-core module, and its K recurrent draft steps in training.

Design note: which token and position each step sees. Let x_0..x_{S-1} be a training sequence, h(t) the
frozen target's hidden state at position t after its final norm, and KV_kind the keys/values its last
layer of each kind stored in the same forward. Drafting in transformers (``SinglePositionMultiToken
CandidateGenerator``; decoder.py does the same) with x_0..x_{N-1} committed and the
target's cache holding positions 0..N-2: step 1 reads [E(x_{N-1}) ; h(N-2)], step j > 1 reads
[E(token drafted at j-1) ; post_projection of step j-1], every step's query at position N-1 over the keys
of positions 0..N-2, and step j predicts x_{N-1+j}. With t = N - 2 every position of a training sequence
is such an anchor, and all anchors of one step run as one sequence:

    step 1:   z_1(t) = A([E(x_{t+1}) ; h(t)])          predicts x_{t+2}
    step k:   z_k(t) = A([E(x_{t+k}) ; P(z_{k-1}(t))])  predicts x_{t+1+k}   (teacher-forced token)

with A the assistant's layers and final norm, P ``post_projection``, E the target's embedding (times
sqrt(H), as the target reads it), every query of anchor t at position t + 1 and seeing the stored keys of
positions 0..t (the last sliding_window + 1 of them in a sliding layer: attention.py). So step k at t
targets the token the sequential MTP depth k targets at t: the per-step loss, the self-distillation
targets and the acceptance are those code paths' (models/mtp_objective.py, training/metrics.py), and the
tokens x_{t+k} are the input ids rolled by k, as megatron-core rolls them for its MTP depths.

Tensor parallelism: ``pre_projection``, ``post_projection`` and the output table are column-parallel;
each projection's output is gathered along the hidden dimension and, with sequence parallelism, split
along the sequence again (megatron-core's MTP treats its ``eh_proj`` so). The output table is the
assistant's own tied embedding (transformers' ``lm_head`` = ``model.embed_tokens``), split by vocabulary
like the target's output layer; its logits are not soft-capped.
"""

from __future__ import annotations

import copy

import torch
from megatron.core.transformer.module import MegatronModule

from megatron_mtp.models.gemma4.assistant.attention import QueryOnlyAttention, QueryOnlySubmodules
from megatron_mtp.models.gemma4.assistant.model_config import assistant_model
from megatron_mtp.models.gemma4.model_config import SLIDING, kind_groups, kind_head_dim, kind_rope


def assistant_transformer_config(cfg, config):
    """The assistant's TransformerConfig: the target's (precision, parallel groups, init, norms) at the
    assistant's width, heads and MLP, one pipeline stage of its own, no experts and no MTP."""
    a = cfg.mtp.assistant
    out = copy.copy(config)
    out.hidden_size, out.num_attention_heads, out.ffn_hidden_size = a.hidden_size, a.num_attention_heads, \
        a.ffn_hidden_size
    out.num_layers, out.mtp_num_layers, out.num_moe_experts, out.moe_layer_freq = a.num_layers, None, None, 1
    out.pipeline_model_parallel_size, out.virtual_pipeline_model_parallel_size = 1, None
    out.pipeline_model_parallel_layout = None
    out.num_layers_in_first_pipeline_stage = out.num_layers_in_last_pipeline_stage = None
    return out


def layer_spec(cfg, platform, kind: str):
    """One assistant layer of ``kind``: a Gemma 4 layer (sandwich norms, dense MLP, ``layer_scalar``) with
    query-only attention."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules

    from megatron_mtp.models.gemma4.feed_forward import FeedForwardBuilder, Gemma4FeedForwardSubmodules
    from megatron_mtp.models.gemma4.specs import _modules, gemma4_layer_class

    m = cfg.model  # the target: the keys the queries meet have its widths, RoPE and window
    norm, column, row, core = _modules(platform)
    base, share = kind_rope(m, kind)
    attention = ModuleSpec(
        module=QueryOnlyAttention,
        params=dict(head_dim=kind_head_dim(m, kind), query_groups=kind_groups(m, kind), rope_base=base,
                    rope_share=share, window=m.sliding_window if kind == SLIDING else None),
        submodules=QueryOnlySubmodules(linear_q=column, linear_proj=row, core_attention=core, q_layernorm=norm,
                                       post_layernorm=norm))
    ffn = FeedForwardBuilder(Gemma4FeedForwardSubmodules(norm=norm, dense=MLPSubmodules(linear_fc1=column,
                                                                                         linear_fc2=row)))
    return ModuleSpec(module=gemma4_layer_class(), submodules=TransformerLayerSubmodules(
        input_layernorm=norm, self_attention=attention, self_attn_bda=get_bias_dropout_add,
        pre_mlp_layernorm=IdentityOp, mlp=ffn, mlp_bda=get_bias_dropout_add))


class AssistantBlock(MegatronModule):
    """``pre_projection``, the layers, ``final_layernorm``, ``post_projection`` and the tied ``output_layer``
    (checkpoint keys ``mtp_assistant.*``; module note)."""

    def __init__(self, cfg, target_config, platform, vocab_size: int):
        from megatron.core.tensor_parallel import ColumnParallelLinear
        from megatron.core.transformer.spec_utils import build_module

        from megatron_mtp.models.gemma4.specs import _modules

        config = assistant_transformer_config(cfg, target_config)
        super().__init__(config=config)
        backbone, width = cfg.model.hidden_size, config.hidden_size
        linear = dict(config=config, init_method=config.init_method, bias=False, gather_output=False)
        self.pre_projection = ColumnParallelLinear(2 * backbone, width, **linear)
        self.kinds = assistant_model(cfg).layer_kinds()
        self.layers = torch.nn.ModuleList(
            build_module(layer_spec(cfg, platform, kind), config=config, layer_number=i + 1)
            for i, kind in enumerate(self.kinds))
        self.final_layernorm = _modules(platform)[0](config=config, hidden_size=width, eps=config.layernorm_epsilon)
        self.post_projection = ColumnParallelLinear(width, backbone, **linear)
        self.output_layer = ColumnParallelLinear(width, vocab_size, **linear)
        clusters = cfg.mtp.assistant.num_centroids
        self.centroids = None
        if clusters:  # the centroid-masked output (centroids.py)
            if vocab_size % clusters:
                from megatron_mtp.errors import UserError

                raise UserError(f"mtp.assistant.num_centroids={clusters} does not divide the vocabulary of "
                                f"{vocab_size} (padded) tokens; every cluster holds vocabulary / num_centroids of them")
            self.centroids = ColumnParallelLinear(width, clusters, **linear)
            self.register_buffer("token_ordering", torch.zeros(vocab_size, dtype=torch.long))

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None):
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint, sharded_state_dict_default

        own: dict = {}
        self._save_to_state_dict(own, "", keep_vars=True)  # its own buffer (token_ordering), replicated
        out = make_sharded_tensors_for_checkpoint(own, prefix, sharded_offsets=sharded_offsets)
        for name, module in self.named_children():
            if name == "layers":  # each layer shards itself (a plain ModuleList would be saved replicated)
                for i, layer in enumerate(module):
                    out.update(layer.sharded_state_dict(f"{prefix}layers.{i}.", sharded_offsets, metadata))
            else:
                out.update(sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets, metadata))
        return out

    def _project(self, linear, x: torch.Tensor) -> torch.Tensor:
        """A column-parallel projection, whole along the hidden dimension and laid out like its input."""
        from megatron.core.tensor_parallel.mappings import (
            gather_from_tensor_model_parallel_region,
            scatter_to_sequence_parallel_region,
        )

        out = gather_from_tensor_model_parallel_region(linear(x)[0])
        return scatter_to_sequence_parallel_region(out) if self.config.sequence_parallel else out

    def forward(self, hidden: torch.Tensor, embeddings: list[torch.Tensor],
                stored: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """The final-normed output [s(/TP), b, width] of each of the ``len(embeddings)`` steps from the target's
        hidden states ``hidden`` and each step's token embeddings (module note); ``stored``: kind -> the
        target's (keys, values)."""
        from contextlib import nullcontext

        from megatron.core.fp8_utils import get_fp8_context

        for layer, kind in zip(self.layers, self.kinds):
            layer.self_attention.shared_kv = stored[kind]
        outputs = []
        try:
            for k, embedding in enumerate(embeddings):
                x = self._project(self.pre_projection, torch.cat([embedding, hidden.to(embedding.dtype)], dim=-1))
                # training.fp8: the layers' TE linears under megatron-core's FP8 recipe, as its MTP layers run
                with get_fp8_context(self.config) if self.config.fp8 else nullcontext():
                    for layer in self.layers:
                        x, _ = layer(hidden_states=x, attention_mask=None)
                x = self.final_layernorm(x)
                outputs.append(x)
                if k + 1 < len(embeddings):
                    hidden = self._project(self.post_projection, x)
        finally:
            for layer in self.layers:
                layer.self_attention.shared_kv = None
        return outputs

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[s, b, V/TP] logits of a step's output over this rank's slice of the assistant's table."""
        return self.output_layer(x)[0]

    def centroid_logits(self, x: torch.Tensor) -> torch.Tensor:
        """[s, b, C/TP] cluster scores of a step's output (this rank's slice of the clusters)."""
        return self.centroids(x)[0]

    def draw_partition(self, table: torch.Tensor) -> None:
        """A new assistant's clusters, from the target's whole embedding table [V, H] (centroids.py); every rank
        computes the same ones from the same table."""
        from megatron_mtp.models.gemma4.assistant.centroids import balanced_kmeans

        ordering = balanced_kmeans(table.detach().float().cpu(), self.centroids.weight.shape[0] * self.tp_size)
        self.token_ordering.copy_(ordering.to(self.token_ordering.device))

    @property
    def tp_size(self) -> int:
        from megatron.core import parallel_state

        return parallel_state.get_tensor_model_parallel_world_size()
