"""Generation with MTP speculative decoding for exported DeepSeek-V3 and GLM-4.5 models (see README.md).

Public API: :func:`megatron_mtp.inference.generate.load_generator`,
:class:`megatron_mtp.inference.generate.Generator` (``generate``, ``generate_batch``),
:class:`megatron_mtp.inference.results.GenerationResult`.
"""
