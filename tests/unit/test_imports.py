"""The top-level packages form layers: each imports only the layers below it, so there are no cycles;
inside each package the modules import one another without cycles too.

Every way the code names a module of its own counts: `import megatron_mtp.x`, `from megatron_mtp.x
import y`, `from megatron_mtp import x`, relative imports, and module paths in strings (the
`importlib.import_module` table of cli.py, `python -m megatron_mtp....` command lines). Imports
inside functions count too (they are how a command avoids loading torch early, but they are
dependencies all the same).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_mtp"
# lowest first; a package may import any package before it and none after it
LAYERS = ["errors", "runtime", "write_causes", "output", "rms_norm", "strict_json", "hf_dir", "config", "platform",
          "models", "plan", "data", "checkpoint", "training", "launch", "convert", "evaluate", "inference",
          "mtp_styles", "cli", "__main__"]
_MODULE_STRING = re.compile(r"^megatron_mtp(\.[A-Za-z_]\w*)+$")


def module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(file: Path, source: str, exact: bool = False) -> list[str]:
    """Every megatron_mtp module `file` names, as dotted paths (``megatron_mtp.a.b``; for ``from X
    import y`` both X and X.y, since y may be a module; `exact`: X alone, the names that must be
    modules)."""
    package = module_name(file) if file.name == "__init__.py" else module_name(file).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [module] + ([] if exact else [f"{module}.{alias.name}" for alias in node.names])
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            found.append(node.value)
    return [m for m in found if m.split(".")[0] == "megatron_mtp"]


def import_graph() -> dict[str, dict[str, str]]:
    """package -> {imported package: first file that imports it}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for file in sorted(PACKAGE.rglob("*.py")):
        parts = file.relative_to(PACKAGE).parts
        source = parts[0] if len(parts) > 1 else parts[0][:-3]
        for name in imported_modules(file, file.read_text()):
            pieces = name.split(".")
            if len(pieces) > 1 and pieces[1] != source:
                graph[source].setdefault(pieces[1], str(file.relative_to(PACKAGE)))
    return graph


def module_graph(package: Path) -> dict[str, dict[str, str]]:
    """Inside one package: module -> {module of the same package it imports: the importing file}."""
    modules = {module_name(f): f for f in package.rglob("*.py")}
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for name, file in modules.items():
        for target in imported_modules(file, file.read_text()):
            if target in modules and target != name and not name.startswith(target + "."):
                graph[name].setdefault(target, str(file.relative_to(PACKAGE)))
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


def test_no_import_cycle_between_modules_inside_a_package():
    cycles = []
    for package in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        cycle = find_cycle(module_graph(package))
        if cycle:
            cycles.append(" -> ".join(cycle))
    assert not cycles, cycles
    assert "megatron_mtp.training.components" in module_graph(PACKAGE / "training")["megatron_mtp.training.trainer"]


def test_every_module_named_exists():
    """A stale module path (a renamed file still named in a string or an import) fails here, not in a
    subprocess at run time; the tests and tools are read too."""
    root = PACKAGE.parent
    missing = []
    for file in sorted([*PACKAGE.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "tools").rglob("*.py")]):
        for name in imported_modules(file, file.read_text(), exact=True) if file.is_relative_to(PACKAGE) else \
                _named_from_outside(file.read_text()):
            if not (_is_module(root, name) or _is_module_file(root, name.rpartition(".")[0])):  # or its attribute
                missing.append(f"{file.relative_to(root)}: {name}")
    assert not missing, missing


def _is_module(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _is_module_file(root: Path, name: str) -> bool:
    return root.joinpath(*name.split(".")).with_suffix(".py").is_file()


def _named_from_outside(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            found.append(node.value)
    return [m for m in found if m.split(".")[0] == "megatron_mtp"]


def test_the_checks_see_a_cycle():
    assert find_cycle({"a": {"b": "x"}, "b": {"c": "y"}, "c": {"a": "z"}}) == ["a", "b", "c", "a"]


def test_every_spelling_of_an_import_is_seen():
    file = PACKAGE / "training" / "example.py"  # never written: only its place in the package matters
    source = "\n".join([
        "from megatron_mtp import strict_json",
        "from . import checkpoint_saver",
        "from ..data import tokenizer",
        "def f():",
        "    import importlib",
        "    importlib.import_module('megatron_mtp.convert.cli')",
    ])
    found = set(imported_modules(file, source))
    assert {"megatron_mtp.strict_json", "megatron_mtp.training.checkpoint_saver", "megatron_mtp.data.tokenizer",
            "megatron_mtp.convert.cli"} <= found, found


def test_the_decoder_reads_hf_directories_through_hf_dir():
    """inference/ reads and loads HF directories through hf_dir/ (below convert/ and inference/) and imports
    nothing of convert/ (a megatron checkpoint is exported by `convert to-hf` in a child process)."""
    uses = sorted((str(file.relative_to(PACKAGE)), name) for file in (PACKAGE / "inference").rglob("*.py")
                  for name in imported_modules(file, file.read_text(), exact=True)
                  if name.startswith("megatron_mtp.convert"))
    assert uses == [], uses
    assert "convert" not in import_graph()["inference"]
    assert "hf_dir" in import_graph()["inference"] and "hf_dir" in import_graph()["convert"]


def _imports_of(package: str) -> list[tuple[str, str]]:
    """(file, module) for every megatron_mtp module the files of `package` name."""
    return sorted((str(file.relative_to(PACKAGE)), name) for file in (PACKAGE / package).rglob("*.py")
                  for name in imported_modules(file, file.read_text(), exact=True))


PLAN_ENTRY_FOR_TRAINING = "megatron_mtp.plan.report"
"""The planner's verdict the trainer prints at start (startup_line): training asks plan for it whole;
the pieces both use (FLOPs, GPU data sheets, the default-corpus rule, expert reach) sit below both."""


def test_training_and_inference_reach_plan_only_through_its_one_entry():
    """training/ asks the planner only for its start-up verdict; inference/ not at all. What they share
    with plan lives below all three (models/, platform/, config/)."""
    reaches = [(file, name) for package in ("training", "inference") for file, name in _imports_of(package)
               if name.startswith("megatron_mtp.plan") and not (package == "training" and name ==
                                                                PLAN_ENTRY_FOR_TRAINING)]
    assert reaches == [], reaches


def test_training_does_not_import_the_launcher():
    uses = [(file, name) for file, name in _imports_of("training") if name.startswith("megatron_mtp.launch")]
    assert uses == [], uses


MAX_LINES = 400


def test_no_module_is_over_400_lines():
    over = {str(f.relative_to(PACKAGE)): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert over == {}, over
