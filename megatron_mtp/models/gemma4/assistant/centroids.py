"""The assistant's centroid-masked output (transformers' ``use_ordered_embeddings``), trained.

Design note. At drafting, the small Gemma 4 assistants do not score the whole vocabulary: a linear layer
(``centroids``: width -> C) scores C clusters of V/C tokens each, the top ``centroid_top_k`` clusters are kept,
and only their tokens get logits from the output table (the others sit below the minimum;
decoder.py ``MaskedEmbedding``). The clusters are a fixed partition written as
``token_ordering``: a permutation of the V token ids whose c-th run of V/C ids is cluster c.

Training keeps the full-vocabulary loss of each step (the table's rows learn as without centroids) and adds
the cross entropy of the centroid scores to the cluster of the step's target token: the data token (targets
tokens, mix) or the target model's argmax (targets self) - the cluster a draft must come from to be
accepted. The centroid logits are vocabulary-parallel like the token logits (C split over the
tensor-parallel ranks), so megatron-core's vocabulary-parallel cross entropy takes them as they are.

The partition of a new assistant is drawn from the target's embedding table (the tokens the assistant's
drafts are judged against): balanced k-means on the normalised rows (cosine), each cluster exactly V/C
tokens, by ``balanced_kmeans``; an imported assistant keeps its own. It is a buffer: checkpointed,
exported and imported unchanged, never trained.
"""

from __future__ import annotations

import torch


def _assign(rows: torch.Tensor, centers: torch.Tensor, per: int, chunk: int = 8192) -> torch.Tensor:
    """Each row's cluster, every cluster exactly ``per`` rows: rows take their best cluster with room left, the
    rows most sure of their best cluster first (each row's 8 best candidates, then any cluster with room)."""
    count = centers.shape[0]
    best, candidates = [], []
    for start in range(0, rows.shape[0], chunk):
        scores = rows[start:start + chunk] @ centers.t()
        top = torch.topk(scores, min(8, count), dim=1)
        best.append(top.values[:, 0])
        candidates.append(top.indices)
    best_score, candidates = torch.cat(best), torch.cat(candidates)
    room = torch.full((count,), per, dtype=torch.long)
    out = torch.full((rows.shape[0],), -1, dtype=torch.long)
    for row in torch.argsort(best_score, descending=True).tolist():
        for c in candidates[row].tolist():
            if room[c] > 0:
                out[row], room[c] = c, room[c] - 1
                break
    left = (out < 0).nonzero().flatten()
    if len(left):  # every candidate full: the clusters with room, in order
        out[left] = torch.repeat_interleave(torch.arange(count), room)[:len(left)]
    return out


def balanced_kmeans(table: torch.Tensor, clusters: int, iterations: int = 6, seed: int = 0) -> torch.Tensor:
    """``token_ordering`` [V] of a partition of the rows of ``table`` [V, H] into ``clusters`` clusters of V/C
    rows each, by cosine similarity (module note)."""
    vocab = table.shape[0]
    per = vocab // clusters
    rows = torch.nn.functional.normalize(table.float(), dim=1)
    generator = torch.Generator().manual_seed(seed)
    centers = rows[torch.randperm(vocab, generator=generator)[:clusters]].clone()
    for _ in range(iterations):
        assign = _assign(rows, centers, per)
        sums = torch.zeros_like(centers).index_add_(0, assign, rows)
        centers = torch.nn.functional.normalize(sums, dim=1)
    assign = _assign(rows, centers, per)
    return torch.argsort(assign * vocab + torch.arange(vocab))  # cluster by cluster, ids ascending inside


def cluster_of(token_ordering: torch.Tensor, per: int) -> torch.Tensor:
    """[V] each token id's cluster, from ``token_ordering``."""
    out = torch.empty_like(token_ordering)
    out[token_ordering] = torch.arange(len(token_ordering), device=token_ordering.device) // per
    return out
