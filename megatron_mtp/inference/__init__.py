"""Generation with MTP speculative decoding for exported models of every family (models/family.py: DeepSeek-V3,
GLM-4.5, Qwen3-MoE, Gemma 4; see README.md).

Public API: :func:`megatron_mtp.inference.generate.load_generator`,
:class:`megatron_mtp.inference.generate.Generator` (``generate``, ``generate_batch``),
:class:`megatron_mtp.inference.results.GenerationResult`.
"""
