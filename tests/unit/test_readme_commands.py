"""The README's commands as a user pastes them: every `megatron-mtp` command and flag it shows exists,
and the command is on PATH in a fresh shell after the setup command's venv is activated."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mtp.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _commands(text: str) -> list[str]:
    """Each `megatron-mtp ...` the README shows: inline code and the lines of its bash blocks."""
    found = re.findall(r"`((?:\S*/)?megatron-mtp [^`]+)`", text)
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            found += re.findall(r"((?:\S*/)?megatron-mtp [^#;&|]+)", line.split(" # ")[0])
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def test_every_command_and_flag_the_readme_shows_exists():
    checked = 0
    for command in _commands((ROOT / "README.md").read_text()):
        words = command.split()[1:]
        parser, path = build_parser(), ["megatron-mtp"]
        while words and words[0] in _subparsers(parser):
            parser = _subparsers(parser)[words[0]]
            path.append(words.pop(0))
        if len(path) == 1:  # prose such as `megatron-mtp ...` or a log line's prefix
            assert not re.match(r"^[a-z-]+$", words[0] if words else ""), command
            continue
        assert not _subparsers(parser), f"`{command}` stops before naming one of {sorted(_subparsers(parser))}"
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", " ".join(words)):
            assert flag in parser._option_string_actions, f"`{' '.join(path)}` has no {flag} (README: `{command}`)"
        checked += 1
    assert checked >= 25, checked  # the table, the examples and the prose's commands


@pytest.mark.skipif(not (Path(sys.executable).parent / "activate").is_file(), reason="not run from a venv")
def test_the_command_is_on_path_in_a_fresh_shell_after_activation():
    venv = Path(sys.executable).parent.parent
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/bin:/bin"}  # a fresh login: no venv on PATH
    script = f"source {venv}/bin/activate && megatron-mtp --help && megatron-mtp runs show --help"
    proc = subprocess.run(["bash", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runs" in proc.stdout and "--json" in proc.stdout
