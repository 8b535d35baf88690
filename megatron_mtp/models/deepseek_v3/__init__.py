"""DeepSeek-V3-style decoder (MLA + MoE) with a sequential MTP block, on megatron-core."""
