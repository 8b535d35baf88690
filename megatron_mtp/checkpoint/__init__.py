"""The on-disk format of a megatron-mtp checkpoint, shared by train, eval, convert, generate and submit.

``run_dir``: where checkpoints live in a run directory and how a user's path names one;
``info``: what a checkpoint records besides tensors (config, train state, tokenizer) and the
rules read from it; ``torch_dist_reader``/``torch_dist_writer``: megatron-core's torch_dist shard
files, read and written without a model or a process group. Nothing here imports torch at module
level except the torch_dist modules, so `submit` stays light.
"""
