"""eval, convert to-hf, drop-mtp and generate accept the same checkpoint arguments.

A run directory, its checkpoints/ directory, a step_N directory and the checkpoints/latest file all
name the newest checkpoint; a run whose `latest` is gone uses its newest complete step and says so.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.convert.helpers import run


def _spellings(run_dir):
    step = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    return step, {"run": run_dir, "checkpoints": run_dir / "checkpoints", "step": step,
                  "latest": run_dir / "checkpoints" / "latest"}


def test_every_command_accepts_the_four_spellings(trained_run, tmp_path, capsys, monkeypatch):
    from megatron_mtp.convert.drop_mtp import drop_mtp
    from megatron_mtp.convert.to_hf import export_to_hf
    from megatron_mtp.inference import checkpoint_source
    from megatron_mtp.inference.generate import load_generator

    monkeypatch.setattr(checkpoint_source, "cache_root", lambda: tmp_path / "exports")  # exported here, once
    step, spellings = _spellings(trained_run)
    exports = []
    for name, path in spellings.items():
        proc = run(["-m", "megatron_mtp", "eval", str(path), "--json", "--steps", "1"])
        assert json.loads(proc.stdout.strip().splitlines()[-1])["checkpoint"] == str(step), name
        out = export_to_hf(path, tmp_path / f"hf_{name}", mtp="none", dtype="fp32")
        exports.append((out / "model.safetensors.index.json").read_text())
        assert (drop_mtp(path, tmp_path / f"dropped_{name}") / "config.yaml").is_file()
        assert load_generator(path).generate([1, 2, 3], max_new_tokens=2, ignore_eos=True).tokens
    assert len(set(exports)) == 1
    # the decoder's export says one line, not the SERVING.md of a folder it renames (exported once, then cached)
    err = capsys.readouterr().err
    assert err.count(f"note: exported {step} to the Hugging Face format for decoding") == 1, err[-3000:]
    assert "vllm serve" not in err and "SERVING" not in err, err[-3000:]


def test_run_without_latest_uses_newest_complete_step_everywhere(trained_run, tmp_path, capsys):
    from megatron_mtp.convert.to_hf import export_to_hf

    copy = tmp_path / "run"
    shutil.copytree(trained_run / "checkpoints", copy / "checkpoints")
    step, _ = _spellings(copy)
    (copy / "checkpoints" / "latest").unlink()
    (copy / "checkpoints" / "step_9999999.tmp").mkdir()  # an interrupted save is never used
    proc = run(["-m", "megatron_mtp", "eval", str(copy), "--json", "--steps", "1"])
    assert json.loads(proc.stdout.strip().splitlines()[-1])["checkpoint"] == str(step)
    assert "using the newest complete checkpoint" in proc.stderr
    export_to_hf(copy, tmp_path / "hf", mtp="none")
    assert "using the newest complete checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["eval", "to-hf", "generate"])
def test_a_path_without_checkpoint_is_one_sentence(tmp_path, command):
    argv = {"eval": ["eval", str(tmp_path)], "to-hf": ["convert", "to-hf", str(tmp_path), str(tmp_path / "o")],
            "generate": ["generate", str(tmp_path), "--prompt", "x"]}[command]
    proc = run(["-m", "megatron_mtp", *argv], timeout=300, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_run_directory_without_checkpoints_is_the_same_sentence_everywhere(tmp_path):
    """A run that never saved (config.yaml and an empty checkpoints/): every command says it holds no checkpoint."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("name: never_saved\n")
    for argv in (["eval", str(tmp_path)], ["convert", "to-hf", str(tmp_path), str(tmp_path / "o")],
                 ["drop-mtp", str(tmp_path), str(tmp_path / "d")], ["generate", str(tmp_path), "--prompt", "x"]):
        proc = run(["-m", "megatron_mtp", *argv], timeout=300, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert f"'{tmp_path}' holds no checkpoint; pass a run directory" in proc.stderr, (argv[0], proc.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "config.yaml"]


def test_an_incomplete_step_given_directly_is_one_sentence_everywhere(trained_run, tmp_path):
    """A step_N that lost a shard file (its metadata.json is there) is refused by name before anything loads."""
    from tests.convert.conftest import TRAIN_OVERRIDES

    step, _ = _spellings(trained_run)
    shard = sorted(step.glob("*.distcp"))[-1]
    copy = tmp_path / "checkpoints" / step.name
    shutil.copytree(step, copy, ignore=lambda folder, names: [shard.name] if folder == str(step) else [])
    for argv in (["eval", str(copy)], ["convert", "to-hf", str(copy), str(tmp_path / "o")],
                 ["drop-mtp", str(copy), str(tmp_path / "d")], ["generate", str(copy), "--prompt", "x"],
                 ["train", "configs/tiny_cpu.yaml", "--run-dir", str(tmp_path / "new"), "--max-steps", "1",
                  *TRAIN_OVERRIDES, f"checkpoint.load={copy}", "checkpoint.load_optimizer=false"]):
        proc = run(["-m", "megatron_mtp", *argv], timeout=300, check=False)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (argv[0], proc.stderr[-3000:])
        assert f"checkpoint {copy} is incomplete ({shard.name} missing); pass another checkpoint" in proc.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "d").exists()
    assert not (tmp_path / "new").exists()  # train refused before it wrote anything
