"""Suite-wide settings: one default-corpus cache per test session, GPU tests skipped without a GPU."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# The default corpus (and megatron-core's dataset index cache) is built once per test session.
os.environ.setdefault("MEGATRON_MTP_CACHE", tempfile.mkdtemp(prefix="megatron_mtp_test_cache_"))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a keyword (a folder named gpu)
            item.add_marker(skip)
