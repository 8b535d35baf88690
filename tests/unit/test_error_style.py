"""One error style for the whole CLI (megatron_mtp/errors.py): every command's refusal of a bad input is
one line, ``megatron-mtp COMMAND: error: SENTENCE``, one sentence without a final period, no traceback,
and the command leaves nothing behind. Run in-process through the real entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.cli import main
from megatron_mtp.errors import UserError, is_one_sentence, sentence

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")
V3 = str(ROOT / "configs" / "deepseek_v3_671b.yaml")

REFUSALS = {  # command line (MISSING: a path that does not exist, OUT: a fresh output path) -> words
    "train-config": (["train", "MISSING.yaml"], "does not exist"),
    "train-key": (["train", TINY, "model.hidden_sise=64"], "did you mean 'hidden_size'"),
    "train-value": (["train", TINY, "mtp.num_layers=-1"], "mtp.num_layers is -1"),
    "train-repeated": (["train", TINY, "mtp.style=parallel", "mtp.repeated_layer=true"], "mtp.repeated_layer"),
    "train-nproc": (["train", TINY, "--nproc-per-node", "0"], "--nproc-per-node is 0"),
    "eval": (["eval", "MISSING"], "does not exist"),
    "preprocess": (["preprocess", "--input", "MISSING.jsonl", "--tokenizer", "MISSING", "--output-prefix", "OUT"],
                   "MISSING"),
    "tokenizer": (["tokenizer", "train", "--input", "MISSING.txt", "--vocab-size", "300", "--output", "OUT"],
                  "MISSING"),
    "to-hf": (["convert", "to-hf", "MISSING", "OUT"], "does not exist"),
    "from-hf": (["convert", "from-hf", "MISSING", "OUT"], "does not exist"),
    "drop-mtp": (["drop-mtp", "MISSING", "OUT"], "MISSING"),
    "generate": (["generate", "MISSING", "--prompt", "x"], "does not exist"),
    "plan": (["plan", TINY], "give --gpus-per-node"),
    "plan-speculative": (["plan", V3, "--speculative", "--serve-ep", "3"], "--serve-ep 3 does not divide"),
    "submit": (["submit", TINY, "--nodes", "0"], "--nodes"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_every_command_refuses_a_bad_input_in_the_one_style(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv, words = REFUSALS[name]
    argv = [a.replace("MISSING", str(tmp_path / "missing")).replace("OUT", str(tmp_path / "out")) for a in argv]
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    head = f"megatron-mtp {argv[0]}: error: "
    assert lines[0].startswith(head), lines[0]
    message = lines[0][len(head):]
    assert is_one_sentence(message), message
    assert words.replace("MISSING", str(tmp_path / "missing")) in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())  # nothing left behind


def test_the_style_is_applied_once_for_every_message():
    assert str(UserError("the file x.json is missing.\n  Fix it")) == "the file x.json is missing. Fix it"
    assert not is_one_sentence("the file x.json is missing. Fix it")  # two sentences
    assert str(UserError("config.json lacks 'vocab_size'.")) == "config.json lacks 'vocab_size'"
    assert sentence("wait...") == "wait..." and is_one_sentence("use e.g. 3 nodes; or fewer")
    assert not is_one_sentence("") and not is_one_sentence("two\nlines")
