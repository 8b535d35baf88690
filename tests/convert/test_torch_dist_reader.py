"""The streaming torch_dist reader on checkpoints written by megatron-core itself."""

import shutil

import pytest
import torch

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.checkpoint.torch_dist_writer import TorchDistWriter
from megatron_mtp.errors import UserError
from tests.convert.helpers import sharded_io
from tests.convert.sharded_io_script import global_tensors


def _check(path):
    reader = TorchDistReader(path)
    reader.validate()
    for name, full in global_tensors().items():
        assert torch.equal(reader.read(name), full), name
        assert reader.read(name).dtype == full.dtype
    experts = "decoder.layers.1.mlp.experts.experts.linear_fc1.weight"
    assert torch.equal(reader.read(experts, (1, 3)), global_tensors()[experts][1:3])
    assert "optimizer.state.exp_avg.decoder.final_layernorm.weight" in reader.keys()
    return reader


@pytest.fixture(scope="module")
def single_process_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ws1") / "ckpt"
    sharded_io("save", path, nproc=1)
    return path


def test_reads_single_process_multi_chunk_checkpoint(single_process_ckpt):
    reader = _check(single_process_ckpt)
    assert len(reader.entry("decoder.layers.0.mlp.linear_fc2.weight").chunks) == 2


@pytest.mark.dist
def test_reads_multi_rank_checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    sharded_io("save", path, nproc=2)
    reader = _check(path)
    assert len(reader.entry("decoder.layers.0.mlp.linear_fc2.weight").chunks) == 4
    assert len({c.file for c in reader.entry("decoder.layers.0.mlp.linear_fc2.weight").chunks}) >= 2


def test_optimizer_state_is_never_read(single_process_ckpt, tmp_path, monkeypatch):
    reader = TorchDistReader(single_process_ckpt)
    touched = []
    original = reader._chunk_tensor
    monkeypatch.setattr(reader, "_chunk_tensor", lambda key, chunk: touched.append(key) or original(key, chunk))
    for name in global_tensors():
        reader.read(name)
    assert touched and not any(k.startswith("optimizer.") for k in touched)


def test_missing_and_truncated_shards_are_errors(single_process_ckpt, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(single_process_ckpt, broken)
    data = sorted(broken.glob("*.distcp"))
    with open(data[0], "r+b") as fh:
        fh.truncate(fh.seek(0, 2) // 2)
    with pytest.raises(UserError, match="truncated"):
        TorchDistReader(broken).validate()
    data[0].unlink()
    with pytest.raises(UserError, match="missing"):
        TorchDistReader(broken).validate()
    (broken / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(UserError, match="damaged"):
        TorchDistReader(broken)
    with pytest.raises(UserError, match="not a torch_dist checkpoint"):
        TorchDistReader(tmp_path)


def test_writer_output_loads_in_megatron_at_another_sharding(tmp_path):
    out = tmp_path / "written"
    writer = TorchDistWriter(out)
    for name, full in global_tensors().items():
        if full.dim() == 3:  # experts: one chunk per expert, as the converter writes them
            writer.declare(name, tuple(full.shape), full.dtype)
            for e in range(full.shape[0]):
                writer.write_chunk(name, (e, 0, 0), full[e : e + 1])
        else:
            writer.write_tensor(name, full)
    writer.write_object("decoder.layers.0.mlp.linear_fc2._extra_state/shard_0_1", [None])
    writer.finish({})
    assert "OK" in sharded_io("load", out).stdout
    reader = TorchDistReader(out)
    for name, full in global_tensors().items():
        assert torch.equal(reader.read(name), full)
