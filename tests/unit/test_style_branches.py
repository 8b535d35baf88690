"""The code outside mtp_styles/ asks the MTP style (config/mtp_style.py) what it does; it does not compare
``mtp.style`` with a style's name. This counts the lines that still do, against a short allowlist."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_mtp"
NAMES = "sequential|parallel|assistant"
BRANCH = re.compile(
    rf"""style\w*(["']\))?\s*(==|!=)\s*["']({NAMES})["']"""  # style == "parallel", .get("style") == "parallel"
    rf"""|["']({NAMES})["']\s*(==|!=)\s*\S*style"""  # "parallel" == cfg.mtp.style
    rf"""|style\w*\s+(not\s+)?in\s*[(\[{{]\s*["']({NAMES})["']"""  # style in ("parallel", ...)
    rf"""|style\w*\s*=\s*\(?\s*["']({NAMES})["']\s+if\b"""  # style = "parallel" if ... else ...
    rf"""|\bif\b[^#]*style\w*\s*else\s*["']({NAMES})["']"""  # x if style else "sequential"
)
ALLOWED: dict[str, int] = {
}
"""file (relative to megatron_mtp/) -> the lines of it that still branch on a style's name."""


def style_branches(root: Path | None = None) -> dict[str, list[str]]:
    """file -> its lines (comments aside) of the package at ``root`` (default: this one) that compare a style's
    name."""
    root = root or PACKAGE
    found: dict[str, list[str]] = {}
    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root).as_posix()
        if rel.startswith("mtp_styles/"):
            continue
        for line in file.read_text().splitlines():
            code = line.split("#", 1)[0]
            if BRANCH.search(code):
                found.setdefault(rel, []).append(line.strip())
    return found


def test_the_branch_pattern_finds_each_form_of_a_comparison(tmp_path):
    (tmp_path / "a.py").write_text('if cfg.mtp.style == "parallel":\n    pass\nx = mtp.style != "assistant"\n'
                                   'ok = style in ("sequential", "parallel")\n'
                                   'style = "parallel" if heads else "sequential"\n'
                                   'y = 1  # mtp.style == "parallel" in a comment\n'
                                   'z = get_style(cfg.mtp.style).chains_modules\n')
    assert [len(v) for v in style_branches(tmp_path).values()] == [4]


def test_only_the_allowlisted_lines_outside_the_styles_compare_a_style_name():
    found = {file: len(lines) for file, lines in style_branches().items()}
    extra = {f: found[f] for f in found if found[f] > ALLOWED.get(f, 0)}
    assert not extra, f"lines that branch on mtp.style's name outside mtp_styles/ (ask the style instead): " \
                      f"{ {f: style_branches()[f] for f in extra} }"
    assert sum(ALLOWED.values()) <= 12
