"""Data: tokenizers, JSONL -> indexed datasets, the embedded default corpus, training datasets.

Entry points: `tokenizer.load_tokenizer` / `tokenizer.train_bpe`, `preprocess.preprocess`,
`default_corpus.ensure_default_corpus`, and for the trainer `datasets.resolve_data`,
`datasets.check_data_config`, `datasets.build_datasets`. See README.md beside this file.
Nothing here imports torch or megatron-core at package import time.
"""
