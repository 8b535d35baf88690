"""A training run reads a corpus as it ships: Parquet shards tokenised by a sharded preprocess (unmerged)
and a zstd JSONL file, blended through a weighted list file with a glob, with document boundaries kept
in the loss and in attention (a materialised mask through the MLA attention and the MTP block); the
start-up line says what it reads, and a resume that would read other datasets is refused."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.mcore]
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")


def test_five_steps_on_parquet_shards_and_zstd_jsonl_through_a_weighted_list(tmp_path, train, metrics, capsys):
    from megatron_mtp.data.default_corpus import default_cache_dir, ensure_default_corpus, select_files
    from megatron_mtp.data.preprocess import preprocess

    tok = ensure_default_corpus(default_cache_dir(None)).tokenizer_dir  # the tiny recipe's own tokenizer
    texts = [text[i:i + 1500] for _, text in select_files(300_000)[0] for i in range(0, len(text), 1500)]
    for i in range(2):
        pq.write_table(pa.table({"text": texts[i::3]}), tmp_path / f"part-{i}.parquet", row_group_size=16)
    (tmp_path / "code.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[2::3]).encode()))
    for i in range(2):
        preprocess([f"{tmp_path}/*.parquet"], tok, str(tmp_path / "web"), append_eod=True, progress=False,
                   shard=(i, 2))
    preprocess([str(tmp_path / "code.jsonl.zst")], tok, str(tmp_path / "code"), append_eod=True, progress=False)
    (tmp_path / "blend.txt").write_text("0.7 web_shard-*\n0.3 code\n")

    run = tmp_path / "run"
    proc = train(run, steps=5, overrides=(f"data.paths=[{tmp_path / 'blend.txt'}]", "data.eod_mask_loss=true",
                                          "data.reset_attention_mask=true", "model.moe_capacity_factor=1.0"))
    line = next(line for line in proc.stdout.splitlines() if line.startswith("megatron-mtp train: data:"))
    shares = re.search(r"3 datasets \(web_shard-00000-of-00002, web_shard-00001-of-00002, code\), [\d,]+ tokens, "
                       r"weights ([\d.]+)/([\d.]+)/([\d.]+); split 98,2,0; .*; documents kept apart in loss and "
                       r"attention$", line)
    assert shares, line
    web0, web1, code = map(float, shares.groups())
    assert web0 + web1 == pytest.approx(0.7, abs=2e-3) and code == pytest.approx(0.3, abs=1e-3)
    rows = metrics(run)
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    # the checkpoint records the datasets the list file resolved to; a resume whose glob sees one more
    # dataset is one sentence, before any process group starts
    saved = json.loads((run / "checkpoints" / "step_0000005" / "train_state.json").read_text())
    assert saved["data_prefixes"]["train"] == [str(tmp_path / f"web_shard-0000{i}-of-00002") for i in (0, 1)] + [
        str(tmp_path / "code")]
    preprocess([str(tmp_path / "code.jsonl.zst")], tok, str(tmp_path / "code_more"), append_eod=True, progress=False)
    (tmp_path / "blend2.txt").write_text("0.7 web_shard-*\n0.3 code*\n")
    resumed = train(run, steps=6, check=False, overrides=(
        f"data.paths=[{tmp_path / 'blend2.txt'}]", "data.eod_mask_loss=true", "data.reset_attention_mask=true",
        "model.moe_capacity_factor=1.0"))
    errors = [line for line in resumed.stderr.splitlines() if "error:" in line]
    assert resumed.returncode == 2 and len(errors) == 1 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert (f"cannot resume {run} from step_0000005: its train datasets resolve to 4 datasets where the checkpoint "
            "read 3: 1 new (code_more), which changes the order") in errors[0] and "data.allow_changed_paths=true" \
        in errors[0], errors[0]
    assert not (run / "checkpoints" / "step_0000006").exists()
    # the run summary train ends with, and `runs show` gives, from the logged rows and the checkpoints
    from megatron_mtp.cli import main

    assert main(["runs", "show", str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 5 and summary["consumed_tokens"] == rows[-1]["progress/consumed_tokens"]
    assert summary["best_lm_loss"] == min(row["train/lm_loss"] for row in rows)
    assert summary["train_seconds"] == pytest.approx(sum(row["perf/step_time_s"] for row in rows))
    assert summary["mtp_acceptance"] == [rows[-1]["train/mtp_acceptance_1"]]
    assert summary["checkpoints"] == sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert f"run {run}: step 5, {int(rows[-1]['progress/consumed_tokens']):,} tokens in" in proc.stdout
    assert main(["runs", "plot", str(run)]) == 0  # its dashboard: the dropped share among the MoE series
    svg = (run / "logs" / "dashboard.svg").read_text()
    assert "<polyline" in svg and ">dropped share</text>" in svg and ">depth 1</text>" in svg
    for row in rows[1:]:  # where the step's time went, and each MoE layer's load (logging/phase_times.py)
        phases = row["time/data_s"] + row["time/forward_backward_s"] + row["time/optimizer_s"]
        assert 0.5 * row["perf/step_time_s"] < phases <= row["perf/step_time_s"], row
        layers = {k: v for k, v in row.items() if k.startswith("moe/imbalance/layer_")}
        assert layers and all(v >= 1.0 for v in layers.values()), row
        mean_violation = sum(v - 1 for v in layers.values()) / len(layers)  # the one number logged before
        assert mean_violation == pytest.approx(row["moe/max_violation"], rel=1e-9), row
        # a capacity of an even share drops tokens in every MoE layer; each layer asks for the same
        # tokens × topk, so the overall share is the layers' mean (training/moe_metrics.py)
        dropped = {k.rsplit("_", 1)[1]: v for k, v in row.items() if k.startswith("moe/dropped/layer_")}
        assert dropped.keys() == {k.rsplit("_", 1)[1] for k in layers} and all(0 < v < 1 for v in dropped.values())
        assert row["moe/dropped_tokens"] == pytest.approx(sum(dropped.values()) / len(dropped), rel=1e-9)
        # the aux-free bias moves each expert by model.router_bias_update_rate (1e-3) a step, up or down
        spreads = {k.rsplit("_", 1)[1]: v for k, v in row.items() if k.startswith("moe/expert_bias_spread/")}
        assert spreads.keys() == dropped.keys(), row
        assert all(0 < v <= 2e-3 * row["step"] + 1e-9 for v in spreads.values()), row
        assert max(spreads.values()) / 2 <= row["moe/expert_bias_absmax"] <= 1e-3 * row["step"] + 1e-9, row
