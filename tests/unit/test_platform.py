"""The CPU platform layer's assumptions about megatron-core and torch still hold.

If a megatron-core upgrade moves a function we neutralise, these tests fail by name instead of
training silently going down a different path.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.mcore


def test_patched_targets_exist():
    from megatron_mtp.platform import cpu

    assert cpu.check_assumptions() == []


def test_no_te_targets_exist():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    assert hasattr(multi_latent_attention, "HAVE_TE")
    assert hasattr(moe_utils, "router_gating_linear")
    for name in ("_set_main_param_and_optimizer_states", "load_state_dict", "state_dict", "step_with_ready_grads"):
        assert hasattr(DistributedOptimizer, name), name


def test_megatron_core_version_in_tested_range():
    import sys
    from importlib.metadata import version

    from megatron_mtp.platform import megatron_core

    major, minor = (int(x) for x in version("megatron-core").split(".")[:2])
    assert (major, minor) in megatron_core.TESTED_LINES
    # pip's markers in pyproject.toml pick 0.16 for Python 3.11 and 0.19 for 3.12
    assert megatron_core.TESTED_LINES[(major, minor)] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    megatron_core.check_supported()


@pytest.mark.parametrize("ver", ["0.15.3", "0.17.0", "0.18.1", "0.20.0", "1.0.0"])
def test_untested_megatron_core_is_refused_in_one_sentence(ver):
    from megatron_mtp.errors import UserError
    from megatron_mtp.platform import megatron_core

    with pytest.raises(UserError) as err:
        megatron_core.check_supported(ver)
    text = str(err.value)
    assert f"megatron-core {ver} is installed" in text and "0.16.x (Python 3.11) and 0.19.x (Python 3.12)" in text
    assert "\n" not in text
    megatron_core.check_supported("0.16.1")
    megatron_core.check_supported("0.19.2")


def test_a_repeated_mtp_layer_is_megatron_core_0_19s_and_refused_on_0_16_in_one_sentence():
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mtp.config import load_config
    from megatron_mtp.errors import UserError
    from megatron_mtp.platform import megatron_core

    mtp = load_config(None, ["mtp.num_layers=2", "mtp.repeated_layer=true"]).mtp
    assert megatron_core.transformer_config_extras(load_config(None, []).mtp) == {}
    if megatron_core.is_019():
        extras = megatron_core.transformer_config_extras(mtp)
        assert extras == {"mtp_use_repeated_layer": True}
        assert set(extras) <= set(TransformerConfig.__dataclass_fields__)
        return
    assert "mtp_use_repeated_layer" not in TransformerConfig.__dataclass_fields__
    with pytest.raises(UserError) as err:
        megatron_core.transformer_config_extras(mtp)
    text = str(err.value)
    assert "mtp.repeated_layer needs megatron-core 0.19" in text and megatron_core.installed_version() in text
    assert "\n" not in text


def test_cpu_patches_redirect_cuda_placements():
    # in a subprocess: the patches are process-wide
    code = textwrap.dedent("""
        import torch
        from megatron_mtp.platform import setup
        plat = setup("cpu")
        assert plat.device == "cpu" and plat.backend == "gloo" and not plat.use_te
        t = torch.zeros(3, device="cuda")
        assert t.device.type == "cpu"
        assert t.cuda().device.type == "cpu" and t.to("cuda").device.type == "cpu"
        assert t.type() == "torch.cuda.FloatTensor"
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            pass
        torch.cuda.synchronize()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_checkpoint_writer_target_exists():
    import importlib

    from megatron_mtp.platform import checkpoint_writer

    module_name, attr = checkpoint_writer.TARGET
    assert hasattr(importlib.import_module(module_name), attr)


def test_known_warnings_are_silenced_and_others_stay_visible():
    import warnings

    from megatron_mtp.platform.known_warnings import KNOWN_HARMLESS, silence_known_harmless

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_known_harmless()
        for known in KNOWN_HARMLESS:
            text = known.message.replace("\\", "").replace("(reduce_scatter_tensor|all_gather_into_tensor)",
                                                           "reduce_scatter_tensor")
            module = known.module.split("|")[0].replace("\\", "") or "megatron.core.models.backends"
            warnings.warn_explicit(text + " (sample)", known.category, "x.py", 1, module=module)
        warnings.warn_explicit("Apex is slow today", UserWarning, "x.py", 1, module="megatron.core.models.backends")
        warnings.warn_explicit("The .grad attribute of a Tensor that is not a leaf Tensor (user code)", UserWarning,
                               "x.py", 1, module="my_training_script")
    assert [str(w.message) for w in caught] == [
        "Apex is slow today", "The .grad attribute of a Tensor that is not a leaf Tensor (user code)"]


def test_checkpoint_writer_queue_survives_the_save_and_exit_signals():
    # Slurm signals every process of a job step; the writer's Manager must outlive SIGUSR1/SIGTERM.
    code = textwrap.dedent("""
        import os, signal, time
        from megatron_mtp.platform import checkpoint_writer
        from megatron.core.dist_checkpointing.strategies import filesystem_async as fa
        checkpoint_writer.apply()
        pid = fa._megatron_mtp_writer_manager._process.pid
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            os.kill(pid, sig)
        time.sleep(0.5)
        fa._results_queue.put("still here")
        print(fa._results_queue.get())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "still here"
