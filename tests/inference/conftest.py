"""Fixtures for the inference tests: tiny random exports built once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from infer_tiny_model import make_tiny_export  # noqa: E402


@pytest.fixture(scope="session")
def export_d1(tmp_path_factory) -> Path:
    """main/ + mtp/ with one MTP module."""
    return make_tiny_export(tmp_path_factory.mktemp("export_d1"), layout="separate", mtp_depth=1, seed=0)


@pytest.fixture(scope="session")
def export_d2(tmp_path_factory) -> Path:
    """main/ + mtp/ with two MTP modules."""
    return make_tiny_export(tmp_path_factory.mktemp("export_d2"), layout="separate", mtp_depth=2, seed=1)


@pytest.fixture(scope="session")
def gen_d1(export_d1):
    from megatron_mtp.inference.generate import load_generator

    return load_generator(export_d1)


@pytest.fixture(scope="session")
def gen_d2(export_d2):
    from megatron_mtp.inference.generate import load_generator

    return load_generator(export_d2)
