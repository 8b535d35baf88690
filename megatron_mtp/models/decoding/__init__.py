"""The decoder's building blocks (torch only, no megatron-core) that every family's decoder shares, below the
family folders so that a family's own decoder (models/<family>/decoder.py) builds on them: the KV cache and the
geometry of a batched forward (kv_cache.py), norms, RoPE, MLP, MoE and the decoder layer around an attention
class (layers.py), the attention kinds several families name (mla.py, gqa.py), and what a drafter keeps
(drafting.py). inference/ runs them: it loads the weights, drafts, verifies and batches."""
