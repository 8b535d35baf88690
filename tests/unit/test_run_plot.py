"""`runs plot`: the dashboard SVG drawn from metrics.jsonl rows."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

from megatron_mtp.cli import main
from megatron_mtp.training.run_plot import draw

SVG = "{http://www.w3.org/2000/svg}"


def _rows(steps: int) -> list[dict]:
    rows = []
    for step in range(10, 10 * steps + 1, 10):
        rows.append({"step": step, "train/lm_loss": 8.0 / step ** 0.3, "train/mtp_loss_1": 9.0 / step ** 0.3,
                     "train/mtp_acceptance_1": math.nan if step == 30 else 1 - 1 / step,
                     "perf/tokens_per_s_per_gpu": 1000.0 + step, "perf/tflops_per_gpu": 0.01,
                     "train/grad_norm": 1.0, "train/grad_norm_max": 2.0, "moe/max_violation": 0.5})
        if step % 50 == 0:
            rows.append({"step": step, "eval/lm_loss": 7.5 / step ** 0.3})
    return rows


def test_each_logged_series_is_a_line_and_a_gap_breaks_it():
    rows = _rows(10)  # eval at steps 50 and 100
    root = ET.fromstring(draw(rows, "run"))
    titles = [t.text for t in root.iter(f"{SVG}text") if t.get("font-weight") == "bold"][1:]
    assert titles == ["LM loss", "MTP loss per depth", "MTP acceptance per depth (teacher-forced)", "throughput",
                      "model TFLOP/s per GPU", "grad norm", "MoE balance"]
    lines = [p.get("points").split() for p in root.iter(f"{SVG}polyline")]
    # train loss, eval loss, MTP loss, acceptance before and after its NaN, tokens/s, TFLOP/s, 2 grad norms, MoE
    assert sorted(map(len, lines)) == sorted([10, 2, 10, 2, 7, 10, 10, 10, 10, 10])
    first = [tuple(map(float, p.split(","))) for p in lines[0]]  # the train loss: falls, so y grows downwards
    assert all(b[0] > a[0] and b[1] > a[1] for a, b in zip(first, first[1:]))


def test_runs_plot_writes_the_svg_or_says_why_not(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(3)))
    assert main(["runs", "plot", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'logs' / 'dashboard.svg'}" in capsys.readouterr().out
    ET.parse(tmp_path / "logs" / "dashboard.svg")
    assert main(["runs", "plot", str(tmp_path / "nothing")]) == 2
    assert "has no logs/metrics.jsonl" in capsys.readouterr().err
    assert main(["runs", "plot", str(tmp_path), "--out", str(tmp_path / "missing" / "d.svg")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d.svg" in err
    assert not list(tmp_path.glob("missing*")) and not list((tmp_path / "logs").glob(".*tmp*"))


@pytest.mark.parametrize("key", ["perf/mfu"])
def test_mfu_is_named_where_logged(key):
    rows = _rows(2)
    rows[0][key] = 0.4
    assert "model TFLOP/s per GPU and MFU" in draw(rows, "run")


def test_the_held_out_loss_the_trainer_logs_reaches_runs_show_and_runs_plot(tmp_path, capsys):
    """Rows written by the trainer's own RunLogger: a training interval, then the evaluation's valid/ scalars."""
    from megatron_mtp.training.run_logger import RunLogger

    log = RunLogger(tmp_path, enabled=True, tensorboard=False)
    for step in (1, 2):
        log.scalars(step, {"train/lm_loss": 8.0 - step, "train/mtp_loss_1": 9.0 - step,
                           "train/mtp_acceptance_1": 0.1, "perf/tokens_per_s_per_gpu": 100.0,
                           "perf/tflops_per_gpu": 0.01, "perf/step_time_s": 1.0})
        log.scalars(step, {"valid/lm_loss": 7.25 - step, "valid/mtp_loss_1": 8.5, "valid/mtp_acceptance_1": 0.1})
    log.close()
    assert main(["runs", "show", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eval_lm_loss"] == 5.25
    assert main(["runs", "show", str(tmp_path)]) == 0
    assert "lm loss 6.0000 (best 6.0000 at step 2), held-out 5.2500" in capsys.readouterr().out
    assert main(["runs", "plot", str(tmp_path)]) == 0
    root = ET.parse(tmp_path / "logs" / "dashboard.svg").getroot()
    assert "held-out (valid)" in [t.text for t in root.iter(f"{SVG}text")]
    # train and held-out loss, MTP loss, acceptance, tokens/s, TFLOP/s
    assert len(list(root.iter(f"{SVG}polyline"))) == 6


def test_an_older_run_logged_as_eval_still_shows_its_held_out_loss(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(10)))
    assert main(["runs", "show", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eval_lm_loss"] == pytest.approx(7.5 / 100 ** 0.3)
