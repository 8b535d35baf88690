"""Fixtures for the inference tests: tiny random exports (DeepSeek-V3, GLM-4.5, Qwen3-MoE) built once per session."""

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


@pytest.fixture(scope="session")
def export_glm(tmp_path_factory) -> Path:
    """GLM-4.5, inline layout (the release's: MTP layer 2 beside the main layers, num_nextn_predict_layers 1),
    random weights, qk-norm and qkv bias on."""
    return make_tiny_export(tmp_path_factory.mktemp("export_glm"), layout="inline", mtp_depth=1, seed=6,
                            family="glm4_moe")


@pytest.fixture(scope="session")
def gen_glm(export_glm):
    from megatron_mtp.inference.generate import load_generator

    return load_generator(export_glm)


@pytest.fixture(scope="session")
def export_qwen3(tmp_path_factory) -> Path:
    """Qwen3-MoE, main/ + mtp/ with two MTP modules under Qwen3's MTP names (``mtp.*``, ``mtp.1.*``), softmax
    routing without shared experts, q/k norms on, near-bigram weights (drafts partly accepted)."""
    return make_tiny_export(tmp_path_factory.mktemp("export_qwen3"), layout="separate", mtp_depth=2, seed=7,
                            family="qwen3_moe", near_bigram=0.05)


@pytest.fixture(scope="session")
def gen_qwen3(export_qwen3):
    from megatron_mtp.inference.generate import load_generator

    return load_generator(export_qwen3)
