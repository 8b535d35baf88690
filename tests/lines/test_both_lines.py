"""The two megatron-core lines side by side: 0.16.x on Python 3.11 and 0.19.x on Python 3.12.

This interpreter's line runs beside the other line's virtual environment (.venv for 0.16,
.venv-py312 for 0.19, as tools/setup_env.sh makes them; or $MEGATRON_MTP_OTHER_LINE_PYTHON). Both
train on one fixed corpus: the default corpus that this line builds, handed to both as data.paths
(the default corpus itself is made from the running Python's standard library, so it differs
between 3.11 and 3.12). Each line builds its own dataset index. Where the other environment is
missing the module is skipped, unless MEGATRON_MTP_BOTH_LINES=1 (CI sets it), where that fails.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mtp.platform import megatron_core

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")
PROBE = str(Path(__file__).with_name("mtp_probe.py"))
SMALL = ["training.seq_length=64", "training.micro_batch_size=2", "training.global_batch_size=8",
         "logging.log_interval=1", "logging.eval_interval=0", "logging.tensorboard=false",
         "schedule.warmup_steps=0", "schedule.decay_style=constant", "model.num_layers=2",
         "checkpoint.save_interval=2"]
COMPARED = ("train/lm_loss", "train/mtp_loss_1", "train/mtp_acceptance_1", "train/mtp_accuracy_1", "train/grad_norm")


def _other_python() -> str:
    named = os.environ.get("MEGATRON_MTP_OTHER_LINE_PYTHON")
    default = ROOT / (".venv" if megatron_core.is_019() else ".venv-py312") / "bin" / "python"
    path = Path(named) if named else default
    if not path.exists():
        why = (f"the other megatron-core line's environment {path} is missing; make it with "
               f"tools/setup_env.sh {'python3.11' if megatron_core.is_019() else 'python3.12'}")
        if os.environ.get("MEGATRON_MTP_BOTH_LINES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return str(path)


def _run(python: str, *argv, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([python, *map(str, argv)], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)
    assert proc.returncode == 0, f"{python} {' '.join(map(str, argv))}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _metrics(run: Path) -> dict[int, dict]:
    lines = (run / "logs" / "metrics.jsonl").read_text().splitlines()
    return {row["step"]: row for row in map(json.loads, lines)}


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """Per line: a 3-step run from scratch (checkpoints at 2 and 3), the MTP probe, and a resume to
    step 3 from the other line's step-2 checkpoint."""
    from megatron_mtp.data.default_corpus import ensure_default_corpus

    other = _other_python()
    pythons = {"here": sys.executable, "other": other}
    base = tmp_path_factory.mktemp("lines")
    corpus = ensure_default_corpus(vocab_size=1024, progress=False)
    data = [f"data.paths=[{corpus.train_prefix}]", f"data.valid_paths=[{corpus.valid_prefix}]",
            f"data.tokenizer={corpus.tokenizer_dir}"]
    out: dict = {"pythons": pythons, "base": base}
    for name, python in pythons.items():
        run = base / f"{name}_run"
        _run(python, "-m", "megatron_mtp", "train", TINY, "--run-dir", run, "--max-steps", 3, *SMALL, *data,
             f"data.cache_dir={base / (name + '_cache')}")
        _run(python, PROBE, TINY, base / f"{name}_probe.pt")
        out[name] = run
    for name, source in (("here", "other"), ("other", "here")):  # each line resumes the other's checkpoint
        resumed = base / f"{name}_resumes_{source}"
        shutil.copytree(out[source], resumed)
        shutil.rmtree(resumed / "checkpoints" / "step_0000003")
        (resumed / "checkpoints" / "latest").write_text("step_0000002\n")
        (resumed / "logs" / "metrics.jsonl").unlink()
        _run(pythons[name], "-m", "megatron_mtp", "train", TINY, "--run-dir", resumed, "--max-steps", 3, *SMALL,
             *data, f"data.cache_dir={base / (name + '_cache')}")
        out[f"{name}_resumes_{source}"] = resumed
    return out


def test_both_lines_are_the_tested_ones(lines):
    import torch

    seen = {tuple(torch.load(lines["base"] / f"{n}_probe.pt")["line"]) for n in ("here", "other")}
    assert seen == set(megatron_core.TESTED_LINES)


def test_losses_acceptance_and_grad_norm_agree_at_every_step(lines):
    here, other = _metrics(lines["here"]), _metrics(lines["other"])
    assert sorted(here) == sorted(other) == [1, 2, 3]
    for step in here:
        for key in COMPARED:
            a, b = here[step][key], other[step][key]
            assert a == pytest.approx(b, rel=1e-6, abs=1e-6), (step, key, a, b)
    assert here[1]["train/mtp_loss_1"] > 1.0  # the MTP loss is there (0.19 once logged 0)


def test_mtp_gradients_are_nonzero_and_agree(lines):
    import torch

    here, other = (torch.load(lines["base"] / f"{n}_probe.pt") for n in ("here", "other"))
    assert here["lm_loss"] == pytest.approx(other["lm_loss"], rel=1e-6)
    assert torch.allclose(here["mtp_loss"], other["mtp_loss"], rtol=1e-6)
    assert set(here["mtp_grads"]) == set(other["mtp_grads"]) and len(here["mtp_grads"]) > 10
    for key, grad in here["mtp_grads"].items():
        assert float(grad.abs().max()) > 0, key
        assert torch.allclose(grad, other["mtp_grads"][key], rtol=1e-5, atol=1e-9), key
    assert torch.equal(here["acceptance"], other["acceptance"])
    # megatron-core 0.19 also counts, per depth, drafts equal to the data token: our accuracy
    core = here["core_counts"] if here["core_counts"] is not None else other["core_counts"]
    ours = here if here["core_counts"] is not None else other
    correct, total = core
    assert float(total[0]) > 0
    assert torch.allclose(correct / total, ours["accuracy"].to(correct.dtype), atol=1e-12)


def test_a_checkpoint_resumes_on_the_other_line_as_on_its_own(lines):
    for name, source in (("here", "other"), ("other", "here")):
        resumed = _metrics(lines[f"{name}_resumes_{source}"])
        uninterrupted = _metrics(lines[source])
        assert sorted(resumed) == [3], resumed.keys()
        for key in COMPARED:
            a, b = resumed[3][key], uninterrupted[3][key]
            assert a == pytest.approx(b, rel=1e-6, abs=1e-6), (name, source, key, a, b)


def test_conversion_writes_the_same_bytes_on_both_lines(lines):
    ckpt = lines["here"] / "checkpoints" / "step_0000003"
    exports = {}
    for name, python in lines["pythons"].items():
        exports[name] = lines["base"] / f"{name}_hf"
        _run(python, "-m", "megatron_mtp", "convert", "to-hf", ckpt, exports[name], "--dtype", "fp32")
    files = sorted(p.relative_to(exports["here"]) for p in exports["here"].rglob("*") if p.is_file())
    assert any(str(f).endswith(".safetensors") for f in files)
    assert files == sorted(p.relative_to(exports["other"]) for p in exports["other"].rglob("*") if p.is_file())
    for rel in files:
        if rel.name == "SERVING.md":  # the serving commands name the export's own path
            texts = [(exports[n] / rel).read_text().replace(str(exports[n]), "OUT") for n in ("here", "other")]
            assert texts[0] == texts[1]
            continue
        assert filecmp.cmp(exports["here"] / rel, exports["other"] / rel, shallow=False), rel
    # and back: each line imports the other's export; both re-export it to the same bytes
    again = {}
    for name, python in lines["pythons"].items():
        imported = lines["base"] / f"{name}_imported"
        _run(python, "-m", "megatron_mtp", "convert", "from-hf", exports["other" if name == "here" else "here"],
             imported)
        again[name] = lines["base"] / f"{name}_hf_again"
        _run(python, "-m", "megatron_mtp", "convert", "to-hf", imported, again[name], "--dtype", "fp32")
    for rel in files:
        if str(rel).endswith(".safetensors"):
            assert filecmp.cmp(again["here"] / rel, exports["here"] / rel, shallow=False), rel
            assert filecmp.cmp(again["other"] / rel, exports["here"] / rel, shallow=False), rel
