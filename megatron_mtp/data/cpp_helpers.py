"""Make megatron-core's C++ dataset helpers (``helpers_cpp``) importable.

megatron-core builds its sample and blend indices with a small pybind11 extension. The PyPI wheel
of megatron-core 0.16 ships it prebuilt (and ships no Makefile, so its own ``compile_helpers()``
cannot work from a wheel install). When the prebuilt module imports, nothing is done. Otherwise
(a source checkout, an unusual platform) we compile ``helpers.cpp`` ourselves with the system
C++ compiler and pybind11's headers into the cache directory, under a file lock so that only one
rank compiles, and register the result as ``megatron.core.datasets.helpers_cpp``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig

from megatron_mtp.errors import UserError
from megatron_mtp.runtime.file_lock import exclusive_lock

_MODULE = "megatron.core.datasets.helpers_cpp"


def ensure_dataset_helpers(cache_dir: str) -> str:
    """Import helpers_cpp, compiling it into cache_dir if needed; returns where it came from."""
    try:
        importlib.import_module(_MODULE)
        return "prebuilt"
    except ImportError:
        pass
    import megatron.core.datasets as mcd

    source = os.path.join(os.path.dirname(mcd.__file__), "helpers.cpp")
    out_dir = os.path.join(cache_dir, "helpers_cpp")
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, "helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    with exclusive_lock(os.path.join(out_dir, "build.lock")):
        if not os.path.isfile(target):
            _compile(source, target)
    spec = importlib.util.spec_from_file_location(_MODULE, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[_MODULE] = module
    return target


def _compile(source: str, target: str) -> None:
    try:
        import pybind11
    except ImportError:
        raise UserError(
            "megatron-core's dataset helpers (helpers_cpp) are missing and compiling them needs pybind11; "
            "run `pip install pybind11` (and have g++ and the Python headers) or install a megatron-core wheel"
        ) from None
    tmp = f"{target}.tmp-{os.getpid()}"
    cmd = [
        os.environ.get("CXX", "g++"), "-O3", "-Wall", "-shared", "-std=c++17", "-fPIC", "-fdiagnostics-color=never",
        f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}", source, "-o", tmp,
    ]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise UserError(
            f"megatron-core's dataset helpers need compiling but the C++ compiler '{cmd[0]}' is not installed; "
            "install g++ or set $CXX"
        ) from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(
            f"compiling megatron-core's dataset helpers failed ({tail[0]}); "
            "check g++ and the Python headers, or install a megatron-core wheel"
        )
    os.replace(tmp, target)
