"""Gloeckle-style parallel MTP heads (``mtp.style: parallel``) beside megatron-core's sequential MTP.

Design note.

What head k sees and predicts. Let ``h(t)`` be the trunk output at position t: the main decoder's
hidden state AFTER its final norm, the very tensor the output layer turns into the main logits (and
the one megatron-core's sequential MTP depth 1 reads). Head k (k = 1..n, n = ``mtp.num_layers``) is

    z_k(t) = RMSNorm_k(Layer_k(h(0..t)))        logits_k(t) = output_layer(z_k(t))   -> token t+1+k

with ``Layer_k`` one transformer layer of the kind the family builds its MTP layer as (DeepSeek-V3: MLA with
MoE or dense, as the engines build that layer; Gemma 4: a full-attention layer), from the family's spec, so
TP/SP/EP, the local/TE spec swap and TE checkpoint names apply, and
``RMSNorm_k`` its own final norm; the output layer is the main model's (shared, called once per
head). Heads read no future token and do not chain: every head sees the same ``h``, so all n drafts
come from one forward of the trunk. "Depth k" means the same target in both styles: the sequential
module k at position t predicts token t+1+k too, so the per-depth loss, acceptance and accuracy
(training/metrics.py, evaluation, the logits probe) are the same code for both.

Why after the final norm: it is where the trunk's output already is on the last pipeline stage in
every layout (megatron-core applies the final norm on the stage of the last decoder layer when
``mtp_num_layers`` is set, which may be an earlier stage than the loss), it is what decoding keeps
per position anyway (inference/target.py returns ``h_0`` after ``model.norm``), and it matches the
input of the sequential style. A head's layer starts with its own input norm, so a normed input is
harmless; its output is an un-normed residual stream, hence its own final norm before the shared
output layer (as megatron-core's MTP layer has ``final_layernorm``).

Objective: ``lm + (λ/n)·Σ_k CE_k`` with ``λ = config.mtp_loss_scaling_factor`` (the trainer's λ
schedule sets it every step), CE_k against the labels rolled by k and the loss mask rolled the same
way (megatron-core's ``roll_tensor``, so the last k positions do not count), each term attached to
the main hidden state with megatron-core's ``MTPLossAutoScaler``: the schedule still sees the plain
LM loss, and per-head losses go to ``MTPLossLoggingHelper``'s tracker where training/interval.py
reads the sequential ones. The output layer is called n times for the heads, then once for the main
model: the order the output-layer hook of training/metrics.py assumes.

Placement: the heads live on the stage that holds the output layer (last pipeline rank, last virtual
chunk). ``config.mtp_num_layers`` stays n, so megatron-core treats them as MTP layers where it counts
them: a pipeline layout string places them as its ``m`` layers (next to the loss), the MoE
aux-loss trackers have n extra rows (head k's layer number is num_layers + k), and the schedule sets
the MTP loss scale. The heads need no embedding, so unlike the sequential style the last stage keeps
no copy of the word embedding: ``setup_embeddings_and_output_layer`` and
``shared_embedding_or_output_weight`` are overridden so that nothing is tied or all-reduced between
the first and last stage unless the embedding is really tied to the output layer.

On a frozen base (``mtp.freeze_base``, models/frozen_base.py) the trunk runs without gradients and the
heads read its detached output; their terms are summed into ``mtp_objective``, which the trainer
back-propagates, instead of being attached to the main hidden state. A checkpoint without these heads
(none, or sequential modules) loads with the heads drawn anew, or with mtp.init=copy_last_layer each
head's layer copied from the last decoder layer (training/checkpoint_state.py).

Checkpoint keys: ``mtp_heads.layers.{k-1}.transformer_layer.*`` (a decoder layer's keys) and
``mtp_heads.layers.{k-1}.final_layernorm.weight``; global (the heads are never split over stages),
so any layout loads any other.

Gloeckle's memory-saving order (``mtp.head_by_head_backward``): the heads run on a detached copy of
``h``; right after head k's forward its term's gradient is taken (w.r.t. ``h`` and the parameters it
used) and its graph freed, so one head's activations and logits are alive at a time instead of n.
The gradients, taken at unit scale, are handed to autograd by ``_DeferredHeadGrads`` when the
backward reaches ``h``, multiplied then by the schedule's MTP loss scale (which megatron-core sets
only after the forward), so parameters get them through the ordinary accumulation hooks (DDP
buckets) exactly once. The price is one gradient of the heads' and the output layer's parameters,
held from the forward to the backward (included in the measurement of tools/compare_mtp_styles.py,
README.md "Two MTP styles"). Not with kernels.gradient_accumulation_fusion, whose weight-gradient
kernel writes into the optimizer's buffer directly (refused at build time). The heads then run
without activation recompute: their graphs are freed in the forward already, and megatron-core's
checkpoint functions refuse ``torch.autograd.grad``.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.module import MegatronModule

from megatron_mtp.errors import UserError
from megatron_mtp.models.frozen_base import FrozenBase
from megatron_mtp.models.output_losses import ChunkedOutputLosses

PREFIX = "mtp_heads."
"""Checkpoint key prefix of the heads (the same as the tensor table's, tensor_table.mcore_head_prefix)."""


class ParallelHead(MegatronModule):
    """One head: a transformer layer on the trunk output, then its own final norm."""

    def __init__(self, config, layer_spec, norm_spec, index: int, vp_stage=None):
        from megatron.core.transformer.spec_utils import build_module
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        super().__init__(config=config)
        # TransformerLayer adds this stage's decoder offset to the number it is given; head k must
        # count as layer num_layers + k (1-based) wherever it sits, like megatron-core's MTP layers
        offset = get_transformer_layer_offset(config, vp_stage)
        self.transformer_layer = build_module(layer_spec, config=config, vp_stage=vp_stage,
                                              layer_number=config.num_layers + index + 1 - offset)
        self.final_layernorm = build_module(norm_spec, config=config, hidden_size=config.hidden_size,
                                            eps=config.layernorm_epsilon)

    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None, rotary_pos_cos=None,
                rotary_pos_sin=None, packed_seq_params=None, sequence_len_offset=None):
        from megatron.core.fp8_utils import get_fp8_context
        from megatron.core.utils import make_viewless_tensor

        rng = tensor_parallel.get_cuda_rng_tracker().fork() if self.config.sequence_parallel else nullcontext()
        fp8 = get_fp8_context(self.config) if self.config.fp8 else nullcontext()
        with rng, fp8:
            out, _ = self.transformer_layer(
                hidden_states=hidden_states, attention_mask=attention_mask, rotary_pos_emb=rotary_pos_emb,
                rotary_pos_cos=rotary_pos_cos, rotary_pos_sin=rotary_pos_sin, packed_seq_params=packed_seq_params,
                sequence_len_offset=sequence_len_offset,
            )
        out = self.final_layernorm(out)
        return make_viewless_tensor(inp=out, requires_grad=True, keep_graph=True)


class ParallelHeads(MegatronModule):
    """The n heads (``mtp_heads.layers.{i}``)."""

    def __init__(self, config, layer_spec, norm_spec, num_heads: int, vp_stage=None):
        super().__init__(config=config)
        self.layers = torch.nn.ModuleList(
            ParallelHead(config, layer_spec, norm_spec, i, vp_stage) for i in range(num_heads)
        )

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None):
        # a plain ModuleList would be saved as replicated tensors; each layer shards itself
        out = {}
        for i, head in enumerate(self.layers):
            out.update(head.sharded_state_dict(f"{prefix}layers.{i}.", sharded_offsets, metadata))
        return out


class _DeferredHeadGrads(torch.autograd.Function):
    """Identity on the trunk output whose backward adds the heads' gradients taken in the forward.

    Inputs: trunk, trunk_grad, n, n parameters, their n gradients (unit loss scale). The backward
    returns the gradients times the schedule's MTP loss scale: for the trunk added to what flows
    back from the main head, for the parameters through autograd's normal accumulation.
    """

    @staticmethod
    def forward(ctx, trunk, trunk_grad, n, *params_and_grads):
        ctx.n = n
        ctx.save_for_backward(trunk_grad, *params_and_grads[n:])
        return trunk

    @staticmethod
    def backward(ctx, grad_output):
        from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

        trunk_grad, *grads = ctx.saved_tensors
        scale = MTPLossAutoScaler.main_loss_backward_scale.to(grad_output.device)
        param_grads = [(scale * g).to(g.dtype) for g in grads]
        return (grad_output + (scale * trunk_grad).to(grad_output.dtype), None, None, *param_grads,
                *([None] * ctx.n))


@contextmanager
def _unit_aux_loss_scale():
    """The MoE aux-loss gradient at unit scale while a head's gradient is taken in the forward (the
    whole head gradient is scaled once, in the backward)."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    saved = MoEAuxLossAutoScaler.main_loss_backward_scale
    MoEAuxLossAutoScaler.main_loss_backward_scale = torch.ones_like(saved) if torch.is_tensor(saved) else 1.0
    try:
        yield
    finally:
        MoEAuxLossAutoScaler.main_loss_backward_scale = saved


def _without_recompute(config):
    """The heads' config under head-by-head backward: no activation recompute inside the heads. Each
    head's graph is freed within the forward anyway (there is nothing left to recompute), and
    megatron-core's checkpoint functions refuse the torch.autograd.grad that takes its gradient."""
    import copy

    heads = copy.copy(config)
    heads.recompute_granularity, heads.recompute_modules = None, []
    heads.recompute_method, heads.recompute_num_layers = None, None
    return heads


class ParallelHeadsGPTModel(FrozenBase, ChunkedOutputLosses, GPTModel):
    """megatron-core's GPTModel with n parallel heads on the last stage instead of the MTP block."""

    def __init__(self, *args, head_layer_spec, head_norm_spec, head_by_head_backward: bool = False,
                 output_chunk: int | None = None, stop_at_documents: bool = False, freeze_base: bool = False,
                 **kwargs):
        from megatron.core.quantization.utils import get_quant_config_or_none

        super().__init__(*args, **kwargs)
        self.output_chunk = output_chunk  # kernels.chunked_output_loss (models/output_losses.py)
        self.stop_at_documents = stop_at_documents  # data.eod_mask_loss (models/document_masks.py)
        assert self.mtp_block_spec is None and self.config.mtp_num_layers, "parallel heads replace the MTP block"
        if head_by_head_backward and self.config.gradient_accumulation_fusion:
            raise UserError("mtp.head_by_head_backward needs kernels.gradient_accumulation_fusion=false (the fused "
                            "kernel adds weight gradients into the optimizer's buffer while they are taken early)")
        self.num_heads = self.config.mtp_num_layers
        self.head_by_head_backward = head_by_head_backward
        if self.post_process:
            head_config = _without_recompute(self.config) if head_by_head_backward else self.config
            self.mtp_heads = ParallelHeads(head_config, head_layer_spec, head_norm_spec, self.num_heads,
                                           vp_stage=self.vp_stage)
            for name, module in self.mtp_heads.named_modules():  # what GPTModel.__init__ does for its modules
                if hasattr(module, "finish_init"):
                    module.finish_init(get_quant_config_or_none(PREFIX + name, self.config.quant_recipe))
        if freeze_base:  # only the heads train (models/frozen_base.py)
            self.freeze((PREFIX,))

    # -- the word embedding is not needed on the last stage ------------------------------------------
    def setup_embeddings_and_output_layer(self) -> None:
        if self.share_embeddings_and_output_weights:
            return super().setup_embeddings_and_output_layer()
        if self.pre_process:
            self.embedding.word_embeddings.weight.is_embedding_or_output_parameter = True
        if self.post_process and self.output_layer.weight is not None:
            self.output_layer.weight.is_embedding_or_output_parameter = True

    def shared_embedding_or_output_weight(self):
        # megatron-core's finalize_model_grads all-reduces this weight between the first and last stage
        # whenever config.mtp_num_layers is set; untied, the two stages share nothing
        if not self.share_embeddings_and_output_weights:
            return None
        return super().shared_embedding_or_output_weight()

    # -- forward ---------------------------------------------------------------------------------------
    def _postprocess(self, hidden_states, input_ids, position_ids, labels, rotary_pos_emb, rotary_pos_cos,
                     rotary_pos_sin, mtp_in_postprocess=None, loss_mask=None, decoder_input=None,
                     attention_mask=None, inference_params=None, packed_seq_params=None, sequence_len_offset=None,
                     runtime_gather_output=None, extra_block_kwargs=None, inference_context=None, **_):
        # **_: keywords megatron-core 0.19 adds (padding_mask, output_processor...), unused by the heads
        if not self.post_process:
            return hidden_states
        if inference_context is not None and not self.training:
            raise NotImplementedError("megatron-core's inference engine does not run parallel MTP heads; decode an "
                                      "export with megatron-mtp generate")
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        if labels is not None:
            head_kwargs = dict(attention_mask=attention_mask, rotary_pos_emb=rotary_pos_emb,
                               rotary_pos_cos=rotary_pos_cos, rotary_pos_sin=rotary_pos_sin,
                               packed_seq_params=packed_seq_params, sequence_len_offset=sequence_len_offset)
            if self.freeze_base:
                with torch.set_grad_enabled(self.grad_for_mtp):
                    terms = self._head_losses(hidden_states.detach(), labels, loss_mask, output_weight,
                                              runtime_gather_output, head_kwargs)
                self.keep_objective(terms)
            else:
                hidden_states = self._head_losses(hidden_states, labels, loss_mask, output_weight,
                                                  runtime_gather_output, head_kwargs)
        if labels is not None and self.output_chunk:
            return self.chunked_token_losses(self.output_input(hidden_states), labels, output_weight)
        logits, _ = self.output_layer(hidden_states, weight=output_weight, runtime_gather_output=runtime_gather_output)
        if labels is None:
            return logits.transpose(0, 1).contiguous()  # [s, b, V] -> [b, s, V]
        return self.compute_language_model_loss(labels, logits)

    def _head_losses(self, hidden_states, labels, loss_mask, output_weight, runtime_gather_output, head_kwargs):
        """Run every head, record its CE, and attach (λ/n)·CE_k to ``hidden_states`` (returned); on a frozen
        base, return the terms instead."""
        from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, roll_tensor

        from megatron_mtp.platform.megatron_core import record_mtp_loss

        n = self.num_heads
        packed = head_kwargs["packed_seq_params"]
        one_at_a_time = (self.head_by_head_backward and self.training and torch.is_grad_enabled()
                         and not self.freeze_base)
        terms = []
        trunk = hidden_states.detach().requires_grad_() if one_at_a_time else hidden_states
        from megatron_mtp.models.document_masks import next_depth_mask

        shifted_labels = labels.clone()
        rolled = mask = loss_mask if loss_mask is not None else torch.ones_like(shifted_labels)
        scale = self.config.mtp_loss_scaling_factor / n
        if one_at_a_time:
            weight = output_weight if output_weight is not None else self.output_layer.weight
            params = [p for p in self.mtp_heads.parameters() if p.requires_grad] + [weight]
            trunk_grad = torch.zeros_like(trunk)
            param_grads: list = [None] * len(params)
        for k, head in enumerate(self.mtp_heads.layers):
            out = head(trunk, **head_kwargs)
            shifted_labels, _ = roll_tensor(shifted_labels, shifts=-1, dims=-1, cp_group=self.cp_group,
                                            packed_seq_params=packed)
            rolled, _ = roll_tensor(rolled, shifts=-1, dims=-1, cp_group=self.cp_group, packed_seq_params=packed)
            # with data.eod_mask_loss a target across a document boundary does not count
            mask = next_depth_mask(mask, rolled) if self.stop_at_documents else rolled
            num_tokens = mask.sum()
            if self.output_chunk:
                logits = None
                loss = self.chunked_token_losses(self.output_input(out), shifted_labels, output_weight) * mask
            else:
                logits, _ = self.output_layer(out, weight=output_weight, runtime_gather_output=runtime_gather_output)
                loss = self.compute_language_model_loss(shifted_labels, logits) * mask
            if self.training:
                record_mtp_loss(
                    torch.sum(loss) / num_tokens, k, n,
                    avg_group=parallel_state.get_data_parallel_group(with_context_parallel=True))
            term = scale * loss if self.config.calculate_per_token_loss else scale * loss / num_tokens
            if self.freeze_base:
                terms.append(term)
                continue
            if not one_at_a_time:
                hidden_states = MTPLossAutoScaler.apply(hidden_states, term)
                continue
            with _unit_aux_loss_scale():
                grads = torch.autograd.grad(term.sum(), [trunk, *params], allow_unused=True)
            trunk_grad += grads[0]
            for i, g in enumerate(grads[1:]):
                if g is not None:
                    param_grads[i] = g if param_grads[i] is None else param_grads[i] + g
            del out, logits, loss, term, grads
        if one_at_a_time:
            used = [i for i, g in enumerate(param_grads) if g is not None]
            hidden_states = _DeferredHeadGrads.apply(hidden_states, trunk_grad, len(used),
                                                     *[params[i] for i in used], *[param_grads[i] for i in used])
        return terms if self.freeze_base else hidden_states
