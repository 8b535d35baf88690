"""A command's output: refused, staged, published whole; a failed write is one sentence and leaves nothing."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron_mtp import output
from megatron_mtp.errors import UserError
from megatron_mtp.output import check_output_free, staged_dir
from megatron_mtp.write_causes import write_failures

REPO = Path(__file__).resolve().parents[2]


def _left(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def _refuse_under(monkeypatch, top: Path, code: int) -> None:
    """Directories under `top` cannot be created (a read-only filesystem or a forbidden directory, as a
    root test process cannot get one from chmod)."""
    real = os.mkdir

    def mkdir(path, *args, **kwargs):
        if str(os.path.abspath(os.fsdecode(path))).startswith(str(top)):
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)


@pytest.mark.parametrize("code, cause, advice", [
    (errno.EROFS, "the filesystem is read-only", "choose a place on a writable filesystem"),
    (errno.EACCES, "permission was denied", "choose a directory you may write to, or fix its permissions"),
])
def test_an_unwritable_parent_is_refused_before_any_work(tmp_path, monkeypatch, code, cause, advice):
    _refuse_under(monkeypatch, tmp_path, code)
    with pytest.raises(UserError) as err:
        check_output_free(tmp_path / "out")
    assert str(err.value) == f"cannot write output '{tmp_path / 'out'}': {cause}; {advice}"
    assert _left(tmp_path) == []


def test_a_read_only_directory_for_real(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into a 0o555 directory; the in-process test covers it")
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(UserError, match="permission was denied; choose a directory you may write to"):
            check_output_free(tmp_path / "out")
    finally:
        tmp_path.chmod(0o755)
    assert _left(tmp_path) == []


def test_a_full_disk_mid_write_removes_the_copy_and_says_how_much(tmp_path):
    with pytest.raises(UserError) as err:
        with staged_dir(tmp_path / "out", needed_bytes=3 << 30) as tmp:
            (tmp / "part").write_bytes(b"x" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
    text = str(err.value)
    assert text.startswith(f"cannot write output '{tmp_path / 'out'}': the filesystem is full (needs about 3.00 GiB, ")
    assert text.endswith(" free); free space there or choose another place for it") and "\n" not in text
    assert _left(tmp_path) == []


def test_a_size_known_up_front_is_checked_against_the_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(output, "free_bytes", lambda path: 5 << 20)
    with pytest.raises(UserError) as err:
        with staged_dir(tmp_path / "out", needed_bytes=12 << 20):
            raise AssertionError("nothing is written when it cannot fit")
    assert str(err.value) == (f"output '{tmp_path / 'out'}' needs about 12.0 MiB and '{tmp_path}' has 5.0 MiB free; "
                              "free space there or choose another place for it")
    assert _left(tmp_path) == []


def test_unknown_size_reports_what_was_written_before_the_disk_filled(tmp_path):
    with pytest.raises(UserError, match=r"the filesystem is full \(needs more than 2.0 MiB, .* free\)"):
        with staged_dir(tmp_path / "out") as tmp:
            (tmp / "part").write_bytes(b"x" * (2 << 20))
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert _left(tmp_path) == []


def test_interrupts_bugs_and_bad_inputs_pass_through_and_leave_nothing(tmp_path):
    for exc in (KeyboardInterrupt(), KeyError("a bug"), UserError("a bad input"),
                FileNotFoundError(errno.ENOENT, "No such file or directory", "/elsewhere/source.safetensors")):
        with pytest.raises(type(exc)) as err:
            with staged_dir(tmp_path / "out") as tmp:
                (tmp / "part").write_text("half")
                raise exc
        assert err.value is exc
        assert _left(tmp_path) == []


def test_a_source_that_cannot_be_read_is_not_called_an_output_failure(tmp_path):
    with pytest.raises(PermissionError):
        with write_failures(tmp_path / "out", written=[tmp_path / ".out.tmp"]):
            raise PermissionError(errno.EACCES, "Permission denied", "/data/model.safetensors")


def test_an_output_that_appeared_meanwhile_is_kept_and_ours_removed(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UserError) as err:
        with staged_dir(out) as tmp:
            (tmp / "ours").write_text("ours")
            out.mkdir()
            (out / "theirs").write_text("theirs")
    assert str(err.value) == (f"output '{out}' appeared while this command was writing it (another command writing "
                              "the same output finished first); that one was kept and this command's copy removed")
    assert _left(tmp_path) == ["out"] and _left(out) == ["theirs"]


def test_an_empty_directory_may_be_replaced_when_the_command_allows_it(tmp_path):
    (tmp_path / "out").mkdir()
    with staged_dir(tmp_path / "out", may_exist_empty=True) as tmp:
        (tmp / "done").write_text("done")
    assert _left(tmp_path) == ["out"] and _left(tmp_path / "out") == ["done"]
    with pytest.raises(UserError, match="already exists"):
        check_output_free(tmp_path / "out", may_exist_empty=True)


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from megatron_mtp.errors import UserError
    from megatron_mtp.output import staged_dir

    out, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    go = out.parent / "go"
    try:
        with staged_dir(out) as tmp:
            (tmp / "data").write_bytes(me.encode() * 100_000)
            (out.parent / f"staged-{me}").touch()
            while not go.exists():  # both have staged before either publishes
                time.sleep(0.01)
            if me == "b":
                while not out.exists():  # a publishes first
                    time.sleep(0.01)
    except UserError as exc:
        print(exc)
        sys.exit(2)
""")


def test_two_processes_writing_one_output(tmp_path):
    out = tmp_path / "race" / "out"
    out.parent.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(out), me, other], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for me, other in (("a", "b"), ("b", "a"))]
    while len(list(out.parent.glob("staged-*"))) < 2 and all(p.poll() is None for p in procs):
        pass
    (out.parent / "go").touch()
    (a_out, a_err), (b_out, b_err) = (p.communicate(timeout=60) for p in procs)
    assert procs[0].returncode == 0, a_err
    assert procs[1].returncode == 2 and "appeared while this command was writing it" in b_out, b_out + b_err
    assert sorted(p.name for p in out.parent.iterdir()) == ["go", "out", "staged-a", "staged-b"]
    assert (out / "data").read_bytes() == b"a" * 100_000


_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from megatron_mtp.output import staged_dir
    with staged_dir(sys.argv[1]) as tmp:
        (Path(tmp) / "shard").write_bytes(b"x" * 100_000)
        print("writing", flush=True)
        time.sleep(600)
""")


def test_the_temporary_of_a_killed_writer_is_removed_by_the_next_and_said(tmp_path, capfd):
    out = tmp_path / "out"
    writers = [subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(out)], cwd=REPO, text=True,
                                stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for w in writers:
            assert w.stdout.readline().strip() == "writing"
        writers[0].kill()  # SIGKILL: no handler runs, its partial shard stays behind
        writers[0].wait()
        before = _left(tmp_path)
        assert len(before) == 2 and all(n.startswith(".out.tmp-") for n in before)
        capfd.readouterr()
        with staged_dir(out) as tmp:
            (tmp / "shard").write_bytes(b"y")
        err = capfd.readouterr().err
        dead = f".out.tmp-{os.uname().nodename}-{writers[0].pid}-"
        assert f"note: removed {tmp_path}/{dead}" in err and f"(pid {writers[0].pid}) that is gone" in err, err
        # the live writer's temporary stays; the dead one's is gone; the output is ours
        assert _left(tmp_path) == sorted(["out", next(n for n in before if f"-{writers[1].pid}-" in n)])
    finally:
        for w in writers:
            w.kill()
            w.wait()
