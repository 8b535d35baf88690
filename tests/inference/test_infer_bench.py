"""tools/bench/bench_speculative.py: the predicted-speedup formulas and a smoke run on the tiny export."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench" / "bench_speculative.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_speculative", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_leviathan_formulas():
    bench = _bench()
    pred = bench.predicted_speedups(0.5, [0.5, 0.5], k=2, c=0.0, v=1.0)
    assert pred["leviathan"] == pytest.approx(1.75) and pred["per_position"] == pytest.approx(1.75)
    pred = bench.predicted_speedups(0.8, [0.9, 0.5], k=2, c=0.25, v=2.0)
    assert pred["leviathan"] == pytest.approx((1 - 0.8**3) / 0.2 / 1.5)
    assert pred["per_position"] == pytest.approx((1 + 0.9 + 0.45) / 1.5)
    assert pred["with_verify"] == pytest.approx((1 + 0.9 + 0.45) / 2.5)
    assert bench.predicted_speedups(1.0, [1.0], k=1, c=0.0, v=1.0)["leviathan"] == pytest.approx(2.0)


def test_bench_smoke(export_d1, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"  # read as `generate --prompts-file` reads it: a prompt's own budget too
    prompts.write_text('{"prompt": "def add(a, b):\\n    return"}\n'
                       '{"prompt": "for i in range(3):", "max_new_tokens": 5}\n')
    out = tmp_path / "bench.json"
    assert _bench().main([str(export_d1), "--ks", "1,2", "--max-new-tokens", "8", "--prompts-file", str(prompts),
                          "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["k"] for row in report["rows"]] == [1, 2]
    assert all(row["runs_identical_to_plain"] == 1.0 for row in report["rows"])  # greedy is exact
    assert "pred(Lev)" in capsys.readouterr().out


def test_bench_rejects_model_without_mtp(tmp_path):
    from infer_tiny_model import make_tiny_export

    root = make_tiny_export(tmp_path / "plain", layout="plain", seed=2)
    assert _bench().main([str(root), "--max-new-tokens", "4"]) == 2
