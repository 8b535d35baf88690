"""Shared fixtures for the data tests: a small synthetic code corpus and a tokenizer trained on it."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def make_documents(n: int, seed: int = 0) -> list[str]:
    """Small Python-like documents of varied length, with some non-ASCII text."""
    rng = random.Random(seed)
    names = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "ηta", "theta"]
    docs = []
    for i in range(n):
        lines = [f"def {rng.choice(names)}_{i}(x, y={rng.randint(0, 99)}):"]
        for _ in range(rng.randint(1, 6)):
            lines.append(f"    x = x * {rng.randint(1, 9)} + {rng.choice(names)}(y)  # ünïcode {rng.random():.3f}")
        lines.append("    return x\n")
        docs.append("\n".join(lines))
    return docs


def write_jsonl(path: Path, texts: list[str], key: str = "text", compress: bool = False) -> Path:
    lines = "".join(json.dumps({key: t, "id": i}) + "\n" for i, t in enumerate(texts))
    if compress:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(lines)
    else:
        path.write_text(lines, encoding="utf-8")
    return path


@pytest.fixture(name="write_jsonl", scope="session")
def write_jsonl_fixture():
    """The write_jsonl helper, as a fixture (test modules cannot import conftest)."""
    return write_jsonl


@pytest.fixture(scope="session")
def documents() -> list[str]:
    return make_documents(300)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, documents) -> Path:
    from megatron_mtp.data.tokenizer import train_bpe

    out = tmp_path_factory.mktemp("tokenizer")
    train_bpe(iter(documents), 320, out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from megatron_mtp.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)
