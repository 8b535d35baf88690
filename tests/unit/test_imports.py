"""The top-level packages form layers: each imports only the layers below it, so there are no cycles.

Imports inside functions count too (they are how a command avoids loading torch early, but they
are dependencies all the same).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_mtp"
# lowest first; a package may import any package before it and none after it
LAYERS = ["errors", "output", "rms_norm", "strict_json", "config", "platform", "models", "plan", "data", "checkpoint",
          "launch", "training", "convert", "inference", "cli", "__main__"]


def import_graph() -> dict[str, dict[str, str]]:
    """package -> {imported package: first file that imports it}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for file in sorted(PACKAGE.rglob("*.py")):
        parts = file.relative_to(PACKAGE).parts
        source = parts[0] if len(parts) > 1 else parts[0][:-3]
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                pieces = name.split(".")
                if pieces[0] == "megatron_mtp" and len(pieces) > 1 and pieces[1] != source:
                    graph[source].setdefault(pieces[1], str(file.relative_to(PACKAGE)))
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, {}):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in list(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycle_between_top_level_packages():
    cycle = find_cycle(import_graph())
    assert not cycle, " -> ".join(cycle)


def test_every_package_imports_only_lower_layers():
    graph = import_graph()
    unknown = sorted((set(graph) | {d for deps in graph.values() for d in deps}) - set(LAYERS))
    assert not unknown, f"add {unknown} to LAYERS"
    upward = [f"{src} imports {dst} (in {where})" for src, deps in graph.items() for dst, where in deps.items()
              if LAYERS.index(dst) > LAYERS.index(src)]
    assert not upward, upward


def test_the_checks_see_a_cycle():
    assert find_cycle({"a": {"b": "x"}, "b": {"c": "y"}, "c": {"a": "z"}}) == ["a", "b", "c", "a"]
