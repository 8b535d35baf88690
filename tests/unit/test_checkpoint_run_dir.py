"""Which checkpoint a path names: one resolver for train, eval, convert, drop-mtp, generate and submit."""

from __future__ import annotations

import pytest

from megatron_mtp.checkpoint.run_dir import REQUIRED_FILES, find_checkpoint, resolve_checkpoint
from megatron_mtp.errors import UserError


def _step(root, step: int, complete: bool = True):
    path = root / "checkpoints" / f"step_{step:07d}"
    path.mkdir(parents=True)
    for name in REQUIRED_FILES if complete else REQUIRED_FILES[:1]:
        (path / name).write_text("{}")
    return path


def _latest(root, name: str):
    (root / "checkpoints" / "latest").write_text(name + "\n")


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
    _latest(tmp_path, "step_0000009")
    found = find_checkpoint(tmp_path)
    assert found.path == newest and "names 'step_0000009', which is not a complete checkpoint" in found.note
    _latest(tmp_path, "step_0000006")
    assert find_checkpoint(tmp_path).path == newest


def test_dangling_latest_without_any_complete_step_is_an_error(tmp_path):
    _step(tmp_path, 6, complete=False)
    _latest(tmp_path, "step_0000006")
    with pytest.raises(UserError, match="no other complete checkpoint") as info:
        find_checkpoint(tmp_path)
    assert "\n" not in str(info.value)


def test_no_checkpoint_and_bad_paths(tmp_path):
    assert find_checkpoint(tmp_path) is None  # an empty run directory: a fresh start
    with pytest.raises(UserError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nowhere")
    with pytest.raises(UserError, match="holds no checkpoint; pass a run directory"):
        resolve_checkpoint(tmp_path)
    incomplete = _step(tmp_path, 3, complete=False)
    with pytest.raises(UserError, match="is incomplete .*config.yaml, train_state.json missing"):
        resolve_checkpoint(incomplete)
