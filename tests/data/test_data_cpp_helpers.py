"""megatron-core's helpers_cpp: the prebuilt module imports, and the compile fallback matches it."""

from __future__ import annotations

import importlib.util
import os
import sysconfig

import numpy as np
import pytest

from megatron_mtp.data.cpp_helpers import _compile, ensure_dataset_helpers


def test_prebuilt_helpers_import(tmp_path):
    assert ensure_dataset_helpers(str(tmp_path)) == "prebuilt"
    assert not os.listdir(tmp_path)  # nothing compiled


@pytest.mark.slow
def test_compiled_fallback_matches_prebuilt(tmp_path):
    pytest.importorskip("pybind11")
    import megatron.core.datasets as mcd
    from megatron.core.datasets import helpers_cpp as prebuilt

    target = str(tmp_path / ("helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX")))
    _compile(os.path.join(os.path.dirname(mcd.__file__), "helpers.cpp"), target)
    spec = importlib.util.spec_from_file_location("helpers_cpp", target)  # name must match PyInit_
    compiled = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compiled)
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 50, size=200).astype(np.int32)
    docs = rng.permutation(200).astype(np.int32)
    args = (sizes, docs, 16, 1, int(sizes.sum()), True, 1)
    np.testing.assert_array_equal(compiled.build_sample_idx_int32(*args), prebuilt.build_sample_idx_int32(*args))
