"""The GPTModel of a Gemma 4 run that trains an assistant on its frozen target (mtp.style assistant).

Design note. The target is megatron-core's GPTModel of the family's own layers, frozen as mtp.freeze_base
freezes a base (models/mtp_objective.py, whose forward, per-depth terms and self-distillation targets
this class inherits): the whole forward runs under no_grad, so the target saves no activations and takes
no gradient, and the trainer back-propagates the kept objective itself (training/forward_step.py). The
target's last layer of each kind keeps its keys and values of the forward (``store_kv``), and on the
stage with the loss the assistant block runs its K steps on the target's final hidden states, detached,
with grad enabled (models/gemma4/assistant/block.py). The assistant's output table makes its steps' logits
before the target's output layer makes the main logits: the order of calls training/metrics.py's hooks on
both layers read (depths, then the main model). Step k's term is (λ/K)·w_k·loss_k, its loss the data
token's cross entropy, the target's own distribution at t + k (mtp.targets self), or their mix, plus with
centroids the cross entropy of its cluster scores (centroids.py). The assistant needs no copy of the word
embedding: the step embeddings are looked up in the tied output weight this stage holds (vocabulary-
parallel, as the embedding is).
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from megatron_mtp.models.gemma4.assistant.block import AssistantBlock
from megatron_mtp.models.gemma4.assistant.model_config import assistant_stored
from megatron_mtp.models.gemma4.hf_view import embedding_multiplier
from megatron_mtp.models.mtp_objective import MTPObjectiveGPTModel


class AssistantGPTModel(MTPObjectiveGPTModel):
    """A frozen Gemma 4 target with an assistant block on its last stage (module note)."""

    def __init__(self, *args, run_config, platform, step_weights=None, head_norm_spec=None, **kwargs):
        # head_norm_spec: what build_gpt_model hands a model that replaces the MTP block; the assistant's norms
        # come from its own layer specs
        super().__init__(*args, freeze_base=True, **kwargs)
        assert self.output_chunk is None, "Gemma 4's soft-capped logits are never chunked"
        self.step_weights = step_weights
        self.embedding_scale = embedding_multiplier(run_config.model.hidden_size)
        if not self.post_process:
            return
        self.mtp_assistant = AssistantBlock(run_config, self.config, platform, self.vocab_size)
        wanted = {index: kind for kind, index in assistant_stored(run_config).items()}
        self._stored = {}
        for layer in self.decoder.layers:  # the target's layers whose keys/values the assistant reads
            kind = wanted.get(layer.layer_number - 1)
            if kind is not None:
                layer.self_attention.store_kv = True
                self._stored[kind] = layer.self_attention

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's scaled embeddings [s(/TP), b, H] of ``ids`` [b, s], from this stage's tied weight."""
        from megatron.core.tensor_parallel.mappings import (
            reduce_from_tensor_model_parallel_region,
            reduce_scatter_to_sequence_parallel_region,
        )

        weight = self.shared_embedding_or_output_weight()
        rows = weight.shape[0]
        first = parallel_state.get_tensor_model_parallel_rank() * rows
        local = ids.t() - first
        outside = (local < 0) | (local >= rows)
        out = torch.nn.functional.embedding(local.masked_fill(outside, 0), weight)
        out = out.masked_fill(outside[..., None], 0.0)
        if parallel_state.get_tensor_model_parallel_world_size() > 1:
            out = (reduce_scatter_to_sequence_parallel_region(out) if self.config.sequence_parallel
                   else reduce_from_tensor_model_parallel_region(out))
        return out * torch.tensor(self.embedding_scale, dtype=out.dtype, device=out.device)

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, rotary_pos_emb, rotary_pos_cos,
                     rotary_pos_sin, mtp_in_postprocess=None, loss_mask=None, **kw):
        if not self.post_process or labels is None:  # a stage without the loss, or plain logits
            for attention in getattr(self, "_stored", {}).values():
                attention.stored_kv = None
            return super()._postprocess(hidden_states, input_ids, position_ids, labels, rotary_pos_emb,
                                        rotary_pos_cos, rotary_pos_sin, mtp_in_postprocess=mtp_in_postprocess,
                                        loss_mask=loss_mask, **kw)
        depth, packed = self.config.mtp_num_layers, kw.get("packed_seq_params")
        stored = {kind: attention.stored_kv for kind, attention in self._stored.items()}
        for attention in self._stored.values():
            attention.stored_kv = None
        ids, embeddings = input_ids, []
        for _ in range(depth):  # step k reads token t + k (teacher forced)
            ids, _ = self._roll(ids, -1, packed)
            embeddings.append(self._embed(ids))
        grad = self.grad_for_mtp
        with torch.set_grad_enabled(grad or torch.is_grad_enabled()):
            outputs = self.mtp_assistant(hidden_states.detach(), embeddings, stored)
            step_logits = [self.mtp_assistant.logits(x) for x in outputs]
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        main_logits, _ = self.output_layer(hidden_states, weight=output_weight,
                                           runtime_gather_output=kw.get("runtime_gather_output"))
        depth_loss = self._whole_depth_loss(main_logits, packed)
        inputs: list = step_logits
        if self.mtp_assistant.centroids is not None:  # each step also learns its target token's cluster
            with torch.set_grad_enabled(grad or torch.is_grad_enabled()):
                inputs = list(zip(step_logits, [self.mtp_assistant.centroid_logits(x) for x in outputs],
                                  self._step_clusters(labels, main_logits, depth, packed)))
            depth_loss = _with_centroid_loss(depth_loss)
        with torch.set_grad_enabled(grad or torch.is_grad_enabled()):
            terms = self._depth_terms(inputs, depth_loss, labels, loss_mask, packed)
            if self.step_weights is not None:
                terms = [w * term for w, term in zip(self.step_weights, terms)]
            self.keep_objective(terms)
        return self.compute_language_model_loss(labels, main_logits).detach()

    def _step_clusters(self, labels, main_logits, depth: int, packed) -> list:
        """[b, s] the cluster of each step's target token: the data token t+1+k, or (mtp.targets self) the
        target model's own argmax at t+k (centroids.py)."""
        from megatron_mtp.models.gemma4.assistant.centroids import cluster_of
        from megatron_mtp.models.soft_cross_entropy import argmax_over_shards

        hard = labels
        if self.targets == "self":  # the target's argmax over its vocabulary shards [s, b] -> [b, s]
            hard = argmax_over_shards(main_logits.detach(), parallel_state.get_tensor_model_parallel_group()).t()
        block = self.mtp_assistant
        clusters = cluster_of(block.token_ordering, block.token_ordering.numel() // (
            block.centroids.weight.shape[0] * block.tp_size))
        out = []
        for _ in range(depth):  # step k's target: labels (token t+1) or the argmax (at t) rolled by k
            hard, _ = self._roll(hard, -1, packed)
            out.append(clusters[hard])
        return out

    def prepare_after_load(self) -> None:
        """A new assistant's centroid partition, from the target's embedding table once it is loaded (every
        rank of the stage gathers the table's vocabulary shards and computes the same partition)."""
        block = getattr(self, "mtp_assistant", None)
        if block is None or block.centroids is None or bool(block.token_ordering.any()):
            return  # none, or loaded with the assistant
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

        weight = self.shared_embedding_or_output_weight().detach()
        table = gather_from_tensor_model_parallel_region(weight.t().contiguous()).t()  # [V, H] whole
        block.draw_partition(table)


def _with_centroid_loss(depth_loss):
    """A step's loss plus the vocabulary-parallel cross entropy of its centroid scores to its target cluster."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    def loss(step, shifted_labels):
        logits, centroid_logits, clusters = step
        return depth_loss(logits, shifted_labels) + vocab_parallel_cross_entropy(
            centroid_logits.float(), clusters.t().contiguous()).t()

    return loss
