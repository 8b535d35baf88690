"""One CLI dialect: one dtype vocabulary for every --dtype (the old spellings still work, with a note),
help texts that name every family, and keys that name a missing capability answered as such."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.cli import build_parser, main
from megatron_mtp.models.family import families


@pytest.mark.parametrize("argv,allowed", [
    (["convert", "to-hf", "CKPT", "OUT"], ("bf16", "fp32", "fp8")),
    (["convert", "from-hf", "HF", "OUT"], ("fp32", "bf16")),
    (["generate", "MODEL", "--prompt", "x"], ("fp32", "bf16", "fp16")),
], ids=["to-hf", "from-hf", "generate"])
def test_every_dtype_flag_speaks_fp32_bf16_and_keeps_the_old_spellings(argv, allowed, capsys):
    parser = build_parser()
    for name in allowed:
        assert parser.parse_args(argv + ["--dtype", name]).dtype == name
    capsys.readouterr()
    for old, new in (("float32", "fp32"), ("bfloat16", "bf16")):
        if new in allowed:
            assert parser.parse_args(argv + ["--dtype", old]).dtype == new
            assert f"note: --dtype {old} is spelled {new} in every command now" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(argv + ["--dtype", "int8"])
    assert f"'int8' is not one of {', '.join(allowed)}" in capsys.readouterr().err


def test_help_texts_name_every_family_and_the_launcher_says_what_it_does(capsys):
    """generate's help names only the families the decoder runs (every one now, the DSA ones included)."""
    titles = [family.title for family in families()]
    decoded = [family.title for family in families() if family.decodes]
    assert len(decoded) >= 3 and {"DeepSeek-V3.2", "GLM-5"} <= set(decoded)
    for argv, named in ((["--help"], titles), (["generate", "--help"], decoded), (["convert", "--help"], titles)):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert all(title in text for title in named), (argv, text)
        assert all(f"{title} (model_type" not in text for title in set(titles) - set(named)), (argv, text)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the command launches them itself" in text and "with torchrun" not in text


def test_context_parallel_is_answered_with_its_field_and_what_it_lacks_is_one_sentence(capsys):
    config = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml")
    assert main(["train", config, "parallel.context_parallel=2"]) == 2
    err = capsys.readouterr().err
    assert "context parallelism is parallel.context" in err and "did you mean" not in err
    for overrides, message in ((["training.seq_length=102"], "must be divisible by 2 × parallel.context × "
                                                               "parallel.tensor = 4"),
                               (["mtp.style=parallel"], "parallel.context=2 does not work with mtp.style=parallel"),
                               (["data.eod_mask_loss=true"], "does not work with data.eod_mask_loss with MTP")):
        assert main(["train", config, "parallel.context=2", "--print-config", *overrides]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_speculative_means_draft_tokens_per_step_in_plan_too(capsys):
    config = str(Path(__file__).resolve().parents[2] / "configs" / "deepseek_v3_671b.yaml")
    drafts = {}
    for argv in (["--speculative", "2"], ["--speculative"]):
        assert main(["plan", config, *argv, "--gpu", "h200", "--serve-tp", "8"]) == 0
        rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:5].strip().isdigit()]
        drafts[len(argv)] = sorted({int(row[1]) for row in rows})
    assert drafts == {2: [2], 1: [1, 2, 3]}
    with pytest.raises(SystemExit):  # generate's K is the same count
        build_parser().parse_args(["generate", "M", "--prompt", "x", "--speculative"])


def test_drop_mtp_is_the_documented_way_and_the_other_spellings_say_so(capsys):
    for argv in (["convert", "to-hf", "--help"], ["convert", "from-hf", "--help"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        assert "`megatron-mtp drop-mtp`" in " ".join(capsys.readouterr().out.split())
