"""GPTModel whose sequential MTP modules learn other targets (mtp.targets: self, mix) and/or train on a
frozen main model (mtp.freeze_base), and/or stop at document boundaries (data.eod_mask_loss), and/or
whose output-layer losses run in chunks (kernels.chunked_output_loss, models/output_losses.py), and with
context parallelism. Used only then; otherwise megatron-core's GPTModel as it is.

Design note. megatron-core's `_postprocess` runs the MTP block on the decoder output, takes each
depth's CE to the data token and attaches (λ/D)·CE_k to the main hidden states (MTPLossAutoScaler),
so it enters through the main loss's backward. Here the same block and output layer run in the same
order (D MTP output-layer calls, then the main one, which the acceptance hook relies on), but:
- targets: the main logits are computed first, and depth k at position i also (or only) learns
  softmax(main logits at position i+k / T), detached: what a greedy verifier accepts for that draft.
  The logits are split over TP ranks, so the CE is vocabulary-parallel (models/soft_cross_entropy.py).
  (λ/D)·loss_k is attached to the returned per-token LM loss instead of the hidden states; its
  gradient is the same.
- freeze_base: the whole forward runs under torch.no_grad() except the MTP block and its losses
  (models/frozen_base.py); the trainer back-propagates their objective itself.
- document boundaries (data.eod_mask_loss): depth k's mask drops every target beyond an EOD, not
  only megatron-core's rolled one (models/document_masks.py).
- context parallelism (parallel.context): each depth's mean is over the tokens of every CP rank, times
  CP, as the main loss (models/context_parallel.py); megatron-core's own normalises per rank.
- chunked output loss: no logits are made; each depth's loss comes from its hidden state and, for
  self/mix, the teacher's from the main hidden state rolled by k (so the teacher is h, not its logits).
  The main model's loss is chunked too, also without MTP layers.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from megatron_mtp.models.context_parallel import over_context
from megatron_mtp.models.frozen_base import FrozenBase
from megatron_mtp.models.output_losses import ChunkedOutputLosses
from megatron_mtp.models.soft_cross_entropy import vocab_parallel_soft_cross_entropy


class MTPObjectiveGPTModel(FrozenBase, ChunkedOutputLosses, GPTModel):
    """GPTModel with mtp.targets, mtp.freeze_base and the chunked output loss (the module's design note)."""

    def __init__(self, *args, targets: str = "tokens", self_weight: float = 0.5, self_temperature: float = 1.0,
                 freeze_base: bool = False, output_chunk: int | None = None, stop_at_documents: bool = False,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.output_chunk = output_chunk
        self.stop_at_documents = stop_at_documents  # data.eod_mask_loss (models/document_masks.py)
        self.targets, self.self_weight, self.self_temperature = targets, self_weight, self_temperature
        if freeze_base:  # mtp_objective: a training micro-batch's Σ_k (λ/D)·loss_k (for the trainer's backward)
            self.freeze(("mtp.",))

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, rotary_pos_emb, rotary_pos_cos,
                     rotary_pos_sin, mtp_in_postprocess=None, loss_mask=None, **kw):
        # kw: megatron-core's other keywords, which differ between its lines (platform/megatron_core.py)
        chunked_main = self.output_chunk and self.post_process and labels is not None
        if not (self.post_process and mtp_in_postprocess and labels is not None) and not chunked_main:
            # a stage without the loss, or decoding: megatron-core's own path
            return super()._postprocess(
                hidden_states, input_ids, position_ids, labels, rotary_pos_emb, rotary_pos_cos, rotary_pos_sin,
                mtp_in_postprocess=mtp_in_postprocess, loss_mask=loss_mask, **kw)
        runtime_gather_output, packed_seq_params = kw.get("runtime_gather_output"), kw.get("packed_seq_params")
        block_kwargs = {name: kw[name] for name in ("padding_mask",) if name in kw}  # 0.19's MTP block takes it
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        grad_for_mtp = self.grad_for_mtp
        with torch.set_grad_enabled(grad_for_mtp or torch.is_grad_enabled()):
            if mtp_in_postprocess:
                stacked = self.mtp(
                    input_ids=input_ids, position_ids=position_ids,
                    hidden_states=hidden_states.detach() if self.freeze_base else hidden_states,
                    attention_mask=kw.get("attention_mask"), inference_params=kw.get("inference_params"),
                    rotary_pos_emb=rotary_pos_emb, rotary_pos_cos=rotary_pos_cos, rotary_pos_sin=rotary_pos_sin,
                    packed_seq_params=packed_seq_params, sequence_len_offset=kw.get("sequence_len_offset"),
                    embedding=self.embedding, **block_kwargs, **(kw.get("extra_block_kwargs") or {}))
                main_hidden, *mtp_hidden = torch.chunk(stacked, 1 + self.config.mtp_num_layers, dim=0)
            else:  # chunked loss of a model without MTP layers
                main_hidden, mtp_hidden = hidden_states, []
        lm_loss, terms = self.output_losses(main_hidden, mtp_hidden, labels, loss_mask, packed_seq_params,
                                            output_weight, grad_for_mtp, runtime_gather_output)
        with torch.set_grad_enabled(grad_for_mtp or torch.is_grad_enabled()):
            if self.freeze_base:
                self.keep_objective(terms)
                return lm_loss.detach()
            from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

            for term in terms:
                lm_loss = MTPLossAutoScaler.apply(lm_loss, term)
        return lm_loss

    def output_losses(self, main_hidden, mtp_hidden: list, labels, loss_mask, packed_seq_params=None,
                      output_weight=None, grad_for_mtp: bool = False, runtime_gather_output=None):
        """The main model's per-token loss [b, s] and each depth's term (``_depth_terms``) from the hidden
        states [s, b, h] entering the output layer: whole logits, or in chunks (kernels.chunked_output_loss)."""
        if self.output_chunk:
            return self._chunked_losses(main_hidden, mtp_hidden, labels, loss_mask, packed_seq_params, output_weight,
                                        grad_for_mtp)
        with torch.set_grad_enabled(grad_for_mtp or torch.is_grad_enabled()):
            mtp_logits = [self.output_layer(h, weight=output_weight, runtime_gather_output=runtime_gather_output)[0]
                          for h in mtp_hidden]
        main_logits, _ = self.output_layer(main_hidden, weight=output_weight,
                                           runtime_gather_output=runtime_gather_output)
        with torch.set_grad_enabled(grad_for_mtp or torch.is_grad_enabled()):
            terms = self._depth_terms(mtp_logits, self._whole_depth_loss(main_logits, packed_seq_params), labels,
                                      loss_mask, packed_seq_params)
        # after the terms: megatron-core's cross entropy overwrites the logits it is given (the teacher)
        return self.compute_language_model_loss(labels, main_logits), terms

    @property
    def _soft_weight(self) -> float:
        """The weight of the soft (self-distilled) part of each depth's loss."""
        return {"tokens": 0.0, "self": 1.0, "mix": self.self_weight}[self.targets]

    def _roll(self, tensor, dims: int, packed_seq_params):
        from megatron.core.transformer.multi_token_prediction import roll_tensor

        return roll_tensor(tensor, shifts=-1, dims=dims, cp_group=self.cp_group, packed_seq_params=packed_seq_params)

    def _whole_depth_loss(self, main_logits, packed_seq_params):
        """Depth k's per-token loss [b, s] from its logits, depths taken in order (the teacher, the main
        model's logits, moves one position further each call)."""
        teacher = main_logits.detach()
        tp_group = parallel_state.get_tensor_model_parallel_group()
        soft_weight = self._soft_weight

        def depth_loss(logits, shifted_labels):
            nonlocal teacher
            loss = 0.0
            if soft_weight:  # first: the token CE below works in place on the logits
                # the main model's prediction at position i+k, [s, b, V/TP] -> [b, s] per-token CE
                teacher, _ = self._roll(teacher, 0, packed_seq_params)
                loss = soft_weight * vocab_parallel_soft_cross_entropy(logits, teacher, self.self_temperature,
                                                                       tp_group).transpose(0, 1)
            if soft_weight < 1:
                loss = loss + (1.0 - soft_weight) * self.compute_language_model_loss(shifted_labels, logits)
            return loss

        return depth_loss

    def _chunked_losses(self, main_hidden, mtp_hidden, labels, loss_mask, packed_seq_params, output_weight,
                        grad_for_mtp):
        """The main loss and the depths' terms with the output layer in chunks (models/output_losses.py)."""
        main = self.output_input(main_hidden)
        soft_weight = self._soft_weight
        teacher = main.detach() if soft_weight else None

        def depth_loss(hidden, shifted_labels):
            nonlocal teacher
            if soft_weight:  # the main model's hidden state at position i+k
                teacher, _ = self._roll(teacher, 0, packed_seq_params)
            return self.chunked_token_losses(self.output_input(hidden), shifted_labels, output_weight, teacher,
                                             soft_weight, self.self_temperature)

        with torch.set_grad_enabled(grad_for_mtp or torch.is_grad_enabled()):
            terms = self._depth_terms(mtp_hidden, depth_loss, labels, loss_mask, packed_seq_params)
        return self.chunked_token_losses(main, labels, output_weight), terms

    def _depth_terms(self, inputs, depth_loss, labels, loss_mask, packed_seq_params) -> list:
        """(λ/D)·loss_k per token (divided by the tokens unless per-token loss) for each depth k, its loss
        ``depth_loss(inputs[k], labels rolled by k)``, recording each depth's mean loss for logging as
        megatron-core does."""
        from megatron_mtp.models.document_masks import next_depth_mask
        from megatron_mtp.platform.megatron_core import record_mtp_loss

        depth = len(inputs)
        shifted_labels = labels.clone()
        rolled = mask = loss_mask if loss_mask is not None else torch.ones_like(shifted_labels)
        scale = self.config.mtp_loss_scaling_factor / max(depth, 1)
        terms = []
        for k, x in enumerate(inputs):
            shifted_labels, _ = self._roll(shifted_labels, -1, packed_seq_params)
            rolled, _ = self._roll(rolled, -1, packed_seq_params)
            # with data.eod_mask_loss a target across a document boundary does not count
            mask = next_depth_mask(mask, rolled) if self.stop_at_documents else rolled
            loss = mask * depth_loss(x, shifted_labels)
            # context parallelism: the depth's tokens are spread over the CP ranks (models/context_parallel.py)
            num_tokens, whole_sum = over_context(mask.sum(), torch.sum(loss).detach(), self.cp_group)
            if self.training:
                record_mtp_loss(
                    whole_sum / num_tokens, k, depth,
                    avg_group=parallel_state.get_data_parallel_group(with_context_parallel=True))
            cp = 1 if self.cp_group is None else torch.distributed.get_world_size(self.cp_group)
            terms.append(scale * loss if self.config.calculate_per_token_loss else scale * loss * cp / num_tokens)
        return terms

