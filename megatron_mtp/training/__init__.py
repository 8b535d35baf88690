"""Training on megatron-core: process groups, model build, loop, checkpoints, metrics, eval."""
