"""Layouts (main/+mtp/, inline, plain), bad inputs as one UserError sentence, and the CLI."""

from __future__ import annotations

import json

import pytest
from infer_tiny_model import make_tiny_export

from megatron_mtp.errors import UserError, is_one_sentence
from megatron_mtp.inference.generate import load_generator
from tests.workers.pool import POOL


def _one_sentence(message: str) -> None:
    assert is_one_sentence(message), message


def test_missing_dir_is_one_sentence(tmp_path):
    with pytest.raises(UserError) as info:
        load_generator(tmp_path / "nope")
    _one_sentence(str(info.value))
    assert "does not exist" in str(info.value)


def test_dir_without_config(tmp_path):
    with pytest.raises(UserError, match="config.json"):
        load_generator(tmp_path)


def test_plain_dir_rejects_speculative(tmp_path):
    root = make_tiny_export(tmp_path, layout="plain", seed=4)
    gen = load_generator(root)
    assert not gen.has_mtp
    assert gen.generate("def", max_new_tokens=3, ignore_eos=True).tokens
    with pytest.raises(UserError) as info:
        gen.generate("def", max_new_tokens=3, speculative_k=2)
    _one_sentence(str(info.value))
    assert "no MTP module" in str(info.value)
    proc = _cli(str(root), "--prompt", "def", "--speculative", "2")
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"megatron-mtp generate: error: {info.value}"
    ]


@pytest.mark.parametrize("k", [-1, 17, 1.5])
def test_bad_k(gen_d1, k):
    with pytest.raises(UserError) as info:
        gen_d1.generate("def", max_new_tokens=3, speculative_k=k)
    _one_sentence(str(info.value))


@pytest.mark.parametrize(
    "kwargs", [{"max_new_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -2}, {"max_new_tokens": 10_000}]
)
def test_bad_sampling_arguments(gen_d1, kwargs):
    with pytest.raises(UserError) as info:
        gen_d1.generate("def", **{"max_new_tokens": 3, **kwargs})
    _one_sentence(str(info.value))


def test_bad_prompt_ids(gen_d1):
    with pytest.raises(UserError, match="outside the vocabulary"):
        gen_d1.generate([5, 10**6], max_new_tokens=2)
    with pytest.raises(UserError, match="empty"):
        gen_d1.generate([], max_new_tokens=2)


def test_missing_mtp_tensor_is_reported(tmp_path):
    from safetensors.torch import load_file, save_file

    root = make_tiny_export(tmp_path, layout="separate", seed=5)
    state = load_file(str(root / "mtp" / "model.safetensors"))
    del state["model.layers.2.hnorm.weight"]
    save_file(state, str(root / "mtp" / "model.safetensors"))
    with pytest.raises(UserError, match="hnorm"):
        load_generator(root)


def test_inline_layout_equals_separate_layout(tmp_path, gen_d1):
    inline = load_generator(make_tiny_export(tmp_path, layout="inline", seed=0))
    assert inline.has_mtp and inline.drafter.depth == 1
    a = inline.generate("def add", max_new_tokens=12, speculative_k=2, ignore_eos=True)
    b = gen_d1.generate("def add", max_new_tokens=12, speculative_k=2, ignore_eos=True)
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted


def _fake_run(tmp_path, name="step_0000010"):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_0000010").mkdir(parents=True)
    (run / "checkpoints" / "step_0000010" / "train_state.json").write_text("{}")
    (run / "checkpoints" / "latest").write_text(name + "\n")
    return run


def test_run_dir_with_dangling_latest(tmp_path):
    with pytest.raises(UserError, match="not a complete checkpoint"):
        load_generator(_fake_run(tmp_path, name="step_0000999"))


def _cli(*args, cwd=None):
    """`megatron-mtp generate ARGS` on a warm rank of the suite (tests/workers)."""
    return POOL.run(["-m", "megatron_mtp", "generate", *args], timeout=300, cwd=cwd)


def test_cli_json_and_stats(export_d1):
    proc = _cli(str(export_d1), "--prompt", "def add(a, b):", "--max-new-tokens", "8", "--speculative", "2",
                "--ignore-eos", "--json", "--stats")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["tokens"]) == 8 and isinstance(out["text"], str)
    stats = out["stats"]
    for key in ("acceptance_per_position", "mean_accept_length", "tokens_per_target_forward",
                "draft_target_time_ratio", "wall_time_s", "tokens_per_s"):
        assert key in stats
    assert len(stats["acceptance_per_position"]) == 2
    assert "mean accept length" in proc.stderr


def test_cli_prompt_file_and_errors(export_d1, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("for i in")
    proc = _cli(str(export_d1), "--prompt-file", str(prompt), "--max-new-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    bad = _cli(str(tmp_path / "missing"), "--prompt", "x")
    assert bad.returncode == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "does not exist" in lines[0]
    bad_k = _cli(str(export_d1), "--prompt", "x", "--speculative", "-3")
    assert bad_k.returncode == 2 and "--speculative" in bad_k.stderr


@pytest.mark.parametrize("family", ["d1", "glm"])
def test_bfloat16_runs_close_to_fp32(request, family):
    export, fp32 = request.getfixturevalue(f"export_{family}"), request.getfixturevalue(f"gen_{family}")
    gen = load_generator(export, dtype="bfloat16")
    ids = gen.encode("def add(a, b):")
    gen.target.reset_cache()
    fp32.target.reset_cache()
    low, _ = gen.target.forward(ids)
    ref, _ = fp32.target.forward(ids)
    assert (low - ref).abs().max() < 0.1 * ref.abs().max()
    result = gen.generate(ids, max_new_tokens=6, speculative_k=2, temperature=0.8, seed=1, ignore_eos=True)
    assert len(result.tokens) == 6
    with pytest.raises(UserError, match="dtype"):
        load_generator(export, dtype="int8")
