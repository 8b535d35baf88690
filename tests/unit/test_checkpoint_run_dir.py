"""Which checkpoint a path names: one resolver for train, eval, convert, drop-mtp, generate and submit.

A step directory is complete when every file its manifest.json lists is present with its size; one
written without a manifest, when torch_dist's index and every shard it names are there and long enough.
"""

from __future__ import annotations

import json

import pytest

from megatron_mtp.checkpoint.run_dir import (
    REQUIRED_FILES,
    find_checkpoint,
    incomplete_reason,
    resolve_checkpoint,
    write_manifest,
)
from megatron_mtp.errors import UserError, is_one_sentence

SHARD = "__0_0.distcp"


def _step(root, step: int, complete: bool = True):
    """A synthetic checkpoint with a manifest (complete), or one that has only metadata.json."""
    path = root / "checkpoints" / f"step_{step:07d}"
    (path / "tokenizer").mkdir(parents=True)
    if not complete:
        (path / REQUIRED_FILES[0]).write_text("{}")
        return path
    for name in REQUIRED_FILES:
        (path / name).write_text("{}")
    for name in (".metadata", "common.pt"):
        (path / name).write_bytes(b"x" * 10)
    (path / SHARD).write_bytes(b"s" * 1000)
    (path / "tokenizer" / "tokenizer.json").write_text('{"model": {}}')
    write_manifest(path)
    return path


def _latest(root, name: str):
    (root / "checkpoints" / "latest").write_text(name + "\n")


def _one_sentence(path, *needles: str) -> str:
    with pytest.raises(UserError) as info:
        resolve_checkpoint(path)
    message = str(info.value)
    assert is_one_sentence(message) and message.startswith(f"checkpoint {path} is incomplete ("), message
    for needle in needles:
        assert needle in message, message
    return message


def test_four_spellings_name_the_same_checkpoint(tmp_path):
    _step(tmp_path, 2)
    newest = _step(tmp_path, 4)
    _latest(tmp_path, newest.name)
    for path in (tmp_path, tmp_path / "checkpoints", newest, tmp_path / "checkpoints" / "latest"):
        found = resolve_checkpoint(path)
        assert found.path == newest and found.note is None, path


def test_latest_missing_or_dangling_uses_newest_complete_step(tmp_path):
    _step(tmp_path, 2)
    newest = _step(tmp_path, 4)
    _step(tmp_path, 6, complete=False)  # a save that died half-way
    found = find_checkpoint(tmp_path)
    assert found.path == newest and "no latest file" in found.note and "step_0000004" in found.note
    assert "step_0000006 is incomplete (config.yaml, train_state.json, .metadata and 1 more missing)" in found.note
    _latest(tmp_path, "step_0000009")
    found = find_checkpoint(tmp_path)
    assert found.path == newest and "names 'step_0000009', which is not a complete checkpoint" in found.note
    _latest(tmp_path, "step_0000006")
    assert find_checkpoint(tmp_path).path == newest


def test_dangling_latest_without_any_complete_step_is_an_error(tmp_path):
    _step(tmp_path, 6, complete=False)
    _latest(tmp_path, "step_0000006")
    with pytest.raises(UserError, match="which is incomplete .*, and no other complete checkpoint") as info:
        find_checkpoint(tmp_path)
    assert "\n" not in str(info.value)


def test_no_checkpoint_and_bad_paths(tmp_path):
    assert find_checkpoint(tmp_path) is None  # an empty run directory: a fresh start
    with pytest.raises(UserError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nowhere")
    with pytest.raises(UserError, match="holds no checkpoint; pass a run directory"):
        resolve_checkpoint(tmp_path)
    incomplete = _step(tmp_path, 3, complete=False)
    _one_sentence(incomplete, "config.yaml, train_state.json, .metadata and 1 more missing")


@pytest.mark.parametrize("lost", [SHARD, "common.pt", ".metadata", "metadata.json", "tokenizer/tokenizer.json"])
def test_a_step_missing_any_listed_file_is_skipped_and_named(tmp_path, lost):
    older = _step(tmp_path, 2)
    newest = _step(tmp_path, 4)
    _latest(tmp_path, newest.name)
    (newest / lost).unlink()
    found = find_checkpoint(tmp_path)
    assert found.path == older
    assert found.note.endswith(f"names 'step_0000004', which is incomplete ({lost} missing); using the newest "
                               "complete checkpoint step_0000002"), found.note
    _one_sentence(newest, f"({lost} missing); pass another checkpoint or the run directory")
    (tmp_path / "checkpoints" / "latest").unlink()  # without latest, the skipped step is named too
    assert f"step_0000004 is incomplete ({lost} missing)" in find_checkpoint(tmp_path).note


def test_a_file_of_another_size_is_incomplete(tmp_path):
    step = _step(tmp_path, 2)
    with open(step / SHARD, "r+b") as fh:
        fh.truncate(600)
    _one_sentence(step, f"({SHARD} truncated (600 of 1000 bytes))")
    (step / SHARD).write_bytes(b"s" * 1200)
    _one_sentence(step, f"({SHARD} has 1200 bytes, not 1000)")
    (step / SHARD).write_bytes(b"s" * 1000)
    assert incomplete_reason(step) is None


def test_edited_text_records_and_a_removed_source_record_keep_a_checkpoint_complete(tmp_path):
    step = tmp_path / "checkpoints" / "step_0000002"
    (step / "hf_source").mkdir(parents=True)
    (step / "hf_source" / "config.json").write_text("{}")
    _step(tmp_path, 2)
    (step / "config.yaml").write_text("name: edited by hand\n")
    (step / "train_state.json").write_text('{"step": 2, "edited": true}')
    (step / "hf_source" / "config.json").unlink()
    assert incomplete_reason(step) is None
    (step / "config.yaml").unlink()  # present they must be
    assert incomplete_reason(step) == "config.yaml missing"


def test_a_damaged_manifest_is_incomplete(tmp_path):
    step = _step(tmp_path, 2)
    (step / "manifest.json").write_text('{"files": ')
    _one_sentence(step, "(manifest.json unreadable)")
    (step / "manifest.json").write_text(json.dumps({"files": {"a": "big"}}))
    assert incomplete_reason(step) == "manifest.json unreadable"


def test_many_missing_files_are_counted_not_listed(tmp_path):
    step = _step(tmp_path, 2)
    listed = json.loads((step / "manifest.json").read_text())["files"]
    listed.update({f"__{r}_0.distcp": 5 for r in range(1, 9)})
    (step / "manifest.json").write_text(json.dumps({"files": listed}))
    assert incomplete_reason(step) == "__1_0.distcp, __2_0.distcp, __3_0.distcp and 5 more missing"


def test_write_checkpoint_info_lists_every_file_last(tmp_path):
    from megatron_mtp.checkpoint.info import train_state_record, write_checkpoint_info
    from megatron_mtp.config import Config

    step = tmp_path / "step"
    (step / "hf_source").mkdir(parents=True)
    (step / SHARD).write_bytes(b"s" * 77)
    (step / "hf_source" / "config.json").write_text("{}")
    write_checkpoint_info(step, Config(), train_state_record(has_optimizer=False))
    listed = json.loads((step / "manifest.json").read_text())["files"]
    assert listed == {name: (step / name).stat().st_size
                      for name in (SHARD, "config.yaml", "hf_source/config.json", "train_state.json")}
    assert sorted(p.name for p in step.iterdir()) == [SHARD, "config.yaml", "hf_source", "manifest.json",
                                                      "train_state.json"]  # no temp file left


def _legacy_step(root, step: int):
    """A checkpoint as written before manifests: real torch_dist files, no manifest.json."""
    import torch

    from megatron_mtp.checkpoint.torch_dist_writer import TorchDistWriter

    path = root / "checkpoints" / f"step_{step:07d}"
    writer = TorchDistWriter(path)
    writer.write_tensor("embedding.word_embeddings.weight", torch.ones(4, 8))
    writer.write_tensor("output_layer.weight", torch.ones(4, 8))
    writer.finish({})
    for name in ("config.yaml", "train_state.json"):
        (path / name).write_text("{}")
    return path


def test_a_checkpoint_without_manifest_is_checked_against_its_torch_dist_index(tmp_path):
    older = _legacy_step(tmp_path, 2)
    step = _legacy_step(tmp_path, 4)
    _latest(tmp_path, step.name)
    assert incomplete_reason(older) is None and find_checkpoint(tmp_path).path == step
    size = (step / SHARD).stat().st_size
    with open(step / SHARD, "r+b") as fh:
        fh.truncate(size - 10)
    _one_sentence(step, f"({SHARD} truncated ({size - 10} of at least {size} bytes))")
    (step / SHARD).unlink()
    _one_sentence(step, f"({SHARD} missing)")
    assert "which is incomplete (__0_0.distcp missing)" in find_checkpoint(tmp_path).note
    (step / "common.pt").unlink()
    _one_sentence(step, f"(common.pt, {SHARD} missing)")
    (step / ".metadata").write_bytes(b"\x80\x04garbage")
    _one_sentence(step, "(.metadata unreadable; common.pt missing)")
    (step / ".metadata").unlink()
    _one_sentence(step, "(.metadata, common.pt missing)")


def test_the_manifest_pins_a_digest_of_every_file_but_the_editable_records(tmp_path):
    import hashlib

    from megatron_mtp.checkpoint.run_dir import read_digests

    step = _step(tmp_path, 2)
    record = json.loads((step / "manifest.json").read_text())
    assert record["digest"] == "sha256"
    assert set(record["digests"]) == set(record["files"]) - {"config.yaml", "train_state.json"}
    for name, digest in record["digests"].items():
        assert hashlib.sha256((step / name).read_bytes()).hexdigest() == digest, name
    write_manifest(step, digests={SHARD: "f" * 64})  # what the rank that wrote the shard computed is taken as is
    sizes, pinned = read_digests(step)
    assert pinned[SHARD] == "f" * 64 and sizes[SHARD] == 1000 and pinned["common.pt"] == record["digests"]["common.pt"]
    (step / "manifest.json").write_text(json.dumps({"files": record["files"]}))  # saved before digests existed
    assert read_digests(step) is None and incomplete_reason(step) is None


def test_each_rank_hashes_the_shards_it_wrote_and_the_load_shares_the_check_by_size(tmp_path):
    from megatron_mtp.checkpoint.digests import own_digests, share

    for name in ("__0_0.distcp", "__1_0.distcp", "group__1_1.distcp", "__11_0.distcp", "common.pt"):
        (tmp_path / name).write_bytes(name.encode())
    assert sorted(own_digests(tmp_path, 1)) == ["__1_0.distcp", "group__1_1.distcp"]
    assert sorted(own_digests(tmp_path, 11)) == ["__11_0.distcp"] and own_digests(tmp_path, 2) == {}
    sizes = {"a": 10, "b": 9, "c": 1, "d": 1, "e": 0}
    parts = [share(sizes, rank, 2) for rank in (0, 1)]
    assert parts == [["a", "d"], ["b", "c", "e"]]  # 11 and 10 bytes, every file once
    assert share(sizes, 0, 1) == ["a", "b", "c", "d", "e"] and share(sizes, 5, 6) == []


def test_a_tensor_whose_bytes_changed_fails_its_digest_where_convert_reads_it(tmp_path):
    from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader

    step = _legacy_step(tmp_path, 2)
    write_manifest(step)
    with TorchDistReader(step) as reader:
        fh, offset, nbytes = reader.byte_range("output_layer.weight")
    with open(step / SHARD, "r+b") as out:
        out.seek(offset + nbytes // 2)
        out.write(b"\xff" * 8)
    with TorchDistReader(step) as reader:
        reader.validate(digests=False)  # sizes and tiling are fine: only the digest sees it
        with pytest.raises(UserError) as info:
            reader.validate()
    assert str(info.value) == (f"checkpoint '{step}' is damaged: {SHARD} does not match its SHA-256 digest in "
                               "manifest.json (its bytes changed after the save); use another checkpoint")
    record = json.loads((step / "manifest.json").read_text())
    (step / "manifest.json").write_text(json.dumps({"files": record["files"]}))
    with TorchDistReader(step) as reader:
        reader.validate()  # a manifest without digests: not checked


def test_a_damaged_step_is_set_aside_beside_an_earlier_damaged_copy_never_over_it(tmp_path):
    from megatron_mtp.checkpoint.run_dir import DAMAGED_DIR, set_aside_damaged

    _step(tmp_path, 1)
    for _ in range(2):
        damaged = _step(tmp_path, 2)
        (damaged / "mark").write_text(str(_))
        assert set_aside_damaged(damaged) == tmp_path / "checkpoints" / "step_0000001"
    aside = tmp_path / DAMAGED_DIR
    assert sorted(p.name for p in aside.iterdir()) == ["step_0000002", "step_0000002.2"]
    assert [(aside / n / "mark").read_text() for n in ("step_0000002", "step_0000002.2")] == ["0", "1"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_0000001"
