"""Hugging Face model directories: safetensors shards and their index (read and streamed writes),
config.json, tokenizer files, DeepSeek's FP8 block weights. Below both ``convert/`` and ``inference/``."""
