"""A sharded preprocess as a real Slurm array (launch/preprocess_array.sbatch) and a dependent merge
job give the unsharded dataset, byte for byte."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from submit_helpers import REPO, read

pytestmark = pytest.mark.slurm
SCRIPT = os.path.join(REPO, "launch", "preprocess_array.sbatch")


def test_a_slurm_array_preprocess_merged_equals_the_unsharded_one(slurm_cluster, tmp_path):
    from megatron_mtp.data.preprocess import preprocess
    from megatron_mtp.data.tokenizer import train_bpe

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [f"def f{i}(x):\n    return x * {i} + {'é' * (i % 3)}\n" * (1 + i % 5) for i in range(120)]
    for part in range(4):
        (corpus / f"part-{part}.jsonl").write_text("".join(json.dumps({"content": t}) + "\n"
                                                          for t in texts[part * 30:(part + 1) * 30]))
    train_bpe(iter(texts), 300, tmp_path / "tok")
    common = ["--tokenizer", str(tmp_path / "tok"), "--text-key", "content", "--append-eod"]
    preprocess([str(corpus)], str(tmp_path / "tok"), str(tmp_path / "whole"), text_key="content", append_eod=True,
               progress=False)

    env = slurm_cluster.env()
    env.update(PYTHON=sys.executable, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    array = subprocess.run(["sbatch", "--parsable", "--array=0-2", "--cpus-per-task=1", SCRIPT,
                            f"{corpus}/*.jsonl", common[1], str(tmp_path / "data" / "corpus"), *common[2:]],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert array.returncode == 0, array.stderr
    job = array.stdout.strip().split(";")[0]
    merge = subprocess.run(["sbatch", "--parsable", f"--dependency=afterok:{job}", "--output", "merge.out", "--wrap",
                            f"{sys.executable} -m megatron_mtp merge-datasets --no-progress --input "
                            f"'{tmp_path}/data/corpus_shard-*' --output-prefix {tmp_path}/data/corpus"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert merge.returncode == 0, merge.stderr
    merged_job = merge.stdout.strip().split(";")[0]
    fields = slurm_cluster.wait_for(merged_job, lambda f: f["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"),
                                    180, "COMPLETED")
    outs = {p.name: read(str(p)) for p in tmp_path.glob("*.out")}
    assert fields["JobState"] == "COMPLETED", (outs, slurm_cluster.logs())
    shards = sorted(p.name for p in (tmp_path / "data").glob("corpus_shard-*.idx"))
    assert shards == [f"corpus_shard-{i:05d}-of-00003.idx" for i in range(3)], outs
    for ext in (".bin", ".idx"):
        assert (tmp_path / "data" / f"corpus{ext}").read_bytes() == (tmp_path / f"whole{ext}").read_bytes()
    assert re.search(r"wrote .*corpus\.bin/\.idx: 120 documents, \d+ tokens from 3 datasets", outs["merge.out"])
