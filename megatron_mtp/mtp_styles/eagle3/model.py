"""The GPTModel of a run that trains an EAGLE-3 drafter on its frozen target (mtp.style eagle3), for any family.

Design note. The target is the family's own GPTModel, frozen as mtp.freeze_base freezes a base
(models/frozen_base.py through models/mtp_objective.py, whose per-step terms and loss logging this class uses):
the whole forward runs under no_grad, so the target saves no activations, and the trainer back-propagates the
kept objective itself (training/forward_step.py). Forward hooks on the decoder layers named by
``mtp.eagle3.aux_layers`` (and on the embedding for id 0) keep a reference to each one's output of this forward,
no copy; on the stage with the loss the drafter (drafter.py) runs its K steps on them, detached, with grad enabled.
Each step's teacher is the target's own next-token distribution one step further on, restricted to the draft
vocabulary: the main logits at the draft ids, softmaxed there (speculators' verifier_lm_head over t2d's rows), and
step k's loss is γ^k · (λ/K) · the mean KL(teacher ‖ draft) over the step's loss mask, logged as mtp_loss_{k+1}.
The token embeddings are the target's table (frozen, read where it lives: no copy). The MTP metrics see each
step's argmax mapped to target ids, then the main model's (the style's ``observes_predictions``:
training/metric_hooks.py), and in evaluation each step's KL, so valid/mtp_loss_k is the same measure as
train/mtp_loss_k.

A new drafter (one its checkpoint.load does not hold) picks its draft vocabulary from the training data and starts
its output head from the target's output rows of it (``prepare_after_load``, as speculators starts its lm_head); a
loaded one keeps both.
"""

from __future__ import annotations

import torch

from megatron_mtp.models.mtp_objective import MTPObjectiveGPTModel
from megatron_mtp.mtp_styles.eagle3.drafter import Eagle3Drafter
from megatron_mtp.mtp_styles.eagle3.shape import drafter_shape
from megatron_mtp.mtp_styles.eagle3.shards import draft_columns, draft_rows, sequence_local


def draft_kl(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) ‖ softmax(logits)) per token [s, b], both over the draft vocabulary, in fp32."""
    log_q = torch.log_softmax(logits.float(), dim=-1)
    p = torch.softmax(teacher.float(), dim=-1)
    return torch.nn.functional.kl_div(log_q, p, reduction="none").sum(-1)


class Eagle3GPTModel(MTPObjectiveGPTModel):
    """A frozen target with an EAGLE-3 drafter on its loss stage (module note)."""

    def __init__(self, *args, run_config, platform=None, head_norm_spec=None, **kwargs):
        # head_norm_spec: what build_gpt_model hands a model that replaces the MTP block; the drafter has its own
        super().__init__(*args, freeze_base=True, **kwargs)
        # the target's logits are made without gradients (frozen) and are the teacher: never chunked
        self.output_chunk = None
        self.run_config = run_config
        self.prediction_observer = None
        self._aux: dict[int, torch.Tensor] = {}
        if not self.post_process:
            return
        shape = drafter_shape(run_config)
        self.mtp_eagle3 = Eagle3Drafter(shape, self.config)
        for layer in self.decoder.layers:  # id i: the output of layer i (counted from 1)
            if layer.layer_number in shape.aux_layers:
                layer.register_forward_hook(self._keeper(layer.layer_number))
        if 0 in shape.aux_layers:  # id 0: the embeddings entering the first layer
            self.embedding.register_forward_hook(self._keeper(0))

    def _keeper(self, index: int):
        def keep(module, inputs, output):
            self._aux[index] = output[0] if isinstance(output, tuple) else output
        return keep

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, rotary_pos_emb, rotary_pos_cos,
                     rotary_pos_sin, mtp_in_postprocess=None, loss_mask=None, **kw):
        aux, self._aux = self._aux, {}
        if not self.post_process or labels is None:  # a stage without the loss, or plain logits
            return super()._postprocess(hidden_states, input_ids, position_ids, labels, rotary_pos_emb,
                                        rotary_pos_cos, rotary_pos_sin, mtp_in_postprocess=mtp_in_postprocess,
                                        loss_mask=loss_mask, **kw)
        drafter, packed = self.mtp_eagle3, kw.get("packed_seq_params")
        ids, embeddings = input_ids, []
        for _ in range(self.config.mtp_num_layers):  # step k reads token t + 1 + k (teacher forced)
            ids, _ = self._roll(ids, -1, packed)
            embeddings.append(sequence_local(self.embedding.word_embeddings(ids), self.embedding.word_embeddings,
                                             self.config.sequence_parallel))
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        grad = self.grad_for_mtp
        with torch.set_grad_enabled(grad or torch.is_grad_enabled()):
            state = torch.cat([aux[i].detach() for i in drafter.shape.aux_layers], dim=-1)
            outputs = drafter(state, embeddings, position_ids + 1)  # step 0 sits at its token's position
            step_logits = [drafter.logits(x) for x in outputs]
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        main_logits, _ = self.output_layer(hidden_states, weight=output_weight,
                                           runtime_gather_output=kw.get("runtime_gather_output"))
        teacher = draft_columns(main_logits, drafter.draft_ids, self.vocab_size)  # vocab-parallel: shards.py
        self._observe(step_logits, main_logits, teacher)

        def step_loss(logits, shifted_labels):
            nonlocal teacher
            teacher, _ = self._roll(teacher, 0, packed)  # the target's distribution one position further
            return draft_kl(logits, teacher).transpose(0, 1)

        with torch.set_grad_enabled(grad or torch.is_grad_enabled()):
            terms = self._depth_terms(step_logits, step_loss, labels, loss_mask, packed)
            decay = drafter.shape.step_loss_decay
            self.keep_objective([decay ** k * term for k, term in enumerate(terms)])
        # after the teacher: megatron-core's cross entropy overwrites the logits it is given
        return self.compute_language_model_loss(labels, main_logits).detach()

    def _observe(self, step_logits: list, main_logits: torch.Tensor, teacher: torch.Tensor) -> None:
        """Each step's argmax as target ids (and in evaluation its KL to the target, what it trains on and
        train/mtp_loss_k logs: the per-depth loss of valid/), then the main model's, to the MTP metrics."""
        observer = self.prediction_observer
        if observer is None or not observer.wants_predictions():
            return
        from megatron.core import parallel_state

        from megatron_mtp.models.soft_cross_entropy import argmax_over_shards

        ids = self.mtp_eagle3.draft_ids
        with torch.no_grad():
            for logits in step_logits:
                teacher = torch.cat([teacher[1:], torch.zeros_like(teacher[:1])])  # one position further
                kl = draft_kl(logits, teacher).t() if observer.compute_ce else None
                observer.observe(ids[logits.argmax(-1)].t(), kl)
            observer.observe(argmax_over_shards(main_logits, parallel_state.get_tensor_model_parallel_group()).t())

    def prepare_after_load(self) -> None:
        """A new drafter's draft vocabulary, from the training data, and its output head, the target's output rows of
        it (every rank computes the same from the same data and weights); a loaded drafter keeps its own."""
        drafter = getattr(self, "mtp_eagle3", None)
        if drafter is None or drafter.has_vocabulary:
            return
        from megatron_mtp.mtp_styles.eagle3.vocab import draft_vocabulary, train_counts

        shape = drafter.shape
        if shape.restricted:
            d2t, t2d = draft_vocabulary(train_counts(self.run_config, shape.vocab), shape.draft_vocab)
        else:
            d2t, t2d = torch.zeros(shape.draft_vocab, dtype=torch.long), torch.ones(shape.vocab, dtype=torch.bool)
        weight = (self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights
                  else self.output_layer.weight)
        with torch.no_grad():
            drafter.d2t.copy_(d2t)
            drafter.t2d.copy_(t2d)
            head = drafter.lm_head.weight
            head.copy_(draft_rows(weight, drafter.draft_ids.to(weight.device), head.shape[0]))
