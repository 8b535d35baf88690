"""The loss masks of the MTP depths, right at document boundaries.

Design note. With `data.eod_mask_loss`, megatron-core's GPTDataset zeroes loss_mask[i] where
tokens[i] is the EOD: the main model does not learn to predict a document's first token from the
one before it. Depth k at position i predicts tokens[i+1+k]; that target lies in another document
exactly when an EOD sits at one of the positions i .. i+k, i.e. when any of loss_mask[i], ...,
loss_mask[i+k] is zero. megatron-core rolls the mask once per depth (mask_k[i] = loss_mask[i+k]),
which catches only the last of those positions; here mask_k is the running product of the rolled
masks, which catches all of them (only with data.eod_mask_loss: the models built then take
`stop_at_documents`; without it every model keeps megatron-core's roll).
"""

from __future__ import annotations


def next_depth_mask(mask, rolled):
    """mask_k from mask_{k-1} and the loss mask rolled k times (both [b, s])."""
    return mask * rolled
