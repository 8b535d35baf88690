"""build_datasets on every rank of a real 2-process gloo job: rank 0 builds the index cache, all agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from megatron_mtp.data.preprocess import preprocess

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    from megatron_mtp.config import load_config
    from megatron_mtp.data.datasets import build_datasets, check_data_config, resolve_data

    prefix, tok, cache, out = sys.argv[1:5]
    cfg = load_config(None, [f"data.paths=[{prefix}]", f"data.tokenizer={tok}", f"data.cache_dir={cache}",
                             "data.split=90,10,0", "training.seq_length=16"])
    resolved = resolve_data(cfg)            # before init: allowed
    check_data_config(cfg, resolved)
    dist.init_process_group("gloo")
    train, valid = build_datasets(cfg, resolved, 200, 20)
    rank = dist.get_rank()
    sample = [train[i]["tokens"].tolist() for i in range(0, 200, 37)] + [valid[0]["tokens"].tolist()]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump({"len": [len(train), len(valid)], "sample": sample}, fh)
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.dist
def test_two_ranks_build_identical_datasets(tmp_path, tokenizer_dir, write_jsonl, documents):
    write_jsonl(tmp_path / "a.jsonl", documents[:100])
    prefix = str(tmp_path / "ds")
    preprocess([str(tmp_path / "a.jsonl")], str(tokenizer_dir), prefix, append_eod=True, progress=False)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "0",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
           str(script), prefix, str(tokenizer_dir), str(tmp_path / "cache"), str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]
    assert results[0]["len"][0] >= 200 and results[0]["len"][1] >= 20
    cached = os.listdir(tmp_path / "cache" / "indices")
    assert any(name.endswith("shuffle_index.npy") for name in cached)
