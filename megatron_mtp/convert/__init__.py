"""Checkpoint conversion: megatron-core torch_dist <-> the Hugging Face formats of every model family
(models/family.py: DeepSeek-V3, DeepSeek-V3.2, GLM-4.5, Qwen3-MoE, Gemma 4), and drop-mtp.

Entry points: ``to_hf.export_to_hf``, ``from_hf.import_from_hf``, ``drop_mtp.drop_mtp``; the design
(streaming reader, output staging, MTP layouts) is described in README.md beside this file.
"""
