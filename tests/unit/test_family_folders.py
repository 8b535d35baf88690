"""A family is one folder (models/family.py): nothing outside models/<family>/ names a module of it, and the
shared packages hold no module named after one.

Every way the code names a module counts, as in test_imports.py: ``import``, ``from ... import`` (relative too,
and ``from megatron_mtp.models import <family>``), imports inside functions, and module paths in strings (a
``lazy("package.module:name")`` target included). models/gqa/ is a shared base of the grouped-query families,
not a family: shared code may name it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from megatron_mtp.models.family import families

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_mtp"
SHARED = ("inference", "plan")
"""Packages that hold only what every family shares."""
_MODULE_STRING = re.compile(r"^(megatron_mtp(?:\.[A-Za-z_]\w*)+)(?::[A-Za-z_]\w*)?$")


def named_modules(file: Path, package_dir: Path) -> list[str]:
    """Every megatron_mtp module ``file`` (under ``package_dir``) names (for ``from X import y``: X and X.y)."""
    parts = list(file.relative_to(package_dir.parent).with_suffix("").parts)
    package = parts if file.name == "__init__.py" else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found += [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _MODULE_STRING.match(node.value)
            if match:
                found.append(match.group(1))
    return found


def crossings(package: Path, family_names: list[str]) -> list[str]:
    """'file names module' for each module of a family named outside that family's folder."""
    out = []
    for file in sorted(package.rglob("*.py")):
        inside = file.relative_to(package).parts
        for name in named_modules(file, package):
            pieces = name.split(".")
            if pieces[:2] != ["megatron_mtp", "models"] or len(pieces) < 3 or pieces[2] not in family_names:
                continue
            if inside[:2] != ("models", pieces[2]):
                out.append(f"{file.relative_to(package)} names {name}")
    return sorted(set(out))


def family_named(package: Path, family_names: list[str]) -> list[str]:
    """Modules of the shared packages named after a family (``gemma4.py``, ``gemma4_assistant.py``)."""
    return sorted(str(f.relative_to(package)) for shared in SHARED for f in (package / shared).rglob("*.py")
                  if any(f.stem == n or f.stem.startswith(n + "_") for n in family_names))


def test_no_module_outside_a_family_folder_names_the_family():
    names = [f.name for f in families()]
    assert {"deepseek_v3", "glm4_moe", "qwen3_moe", "gemma4"} <= set(names)
    assert all((PACKAGE / "models" / n / "__init__.py").is_file() for n in names)
    found = crossings(PACKAGE, names)
    assert not found, found


def test_no_shared_module_is_named_after_a_family():
    found = family_named(PACKAGE, [f.name for f in families()])
    assert not found, found


def test_the_rule_sees_every_way_of_naming_a_family(tmp_path):
    """Each form the rule reads is one it catches (a checker that missed a form would pass vacuously)."""
    root = tmp_path / "megatron_mtp"
    (root / "models" / "fam").mkdir(parents=True)
    (root / "models" / "fam" / "__init__.py").write_text("from megatron_mtp.models.fam import inner\n")
    (root / "models" / "fam" / "inner.py").write_text("")
    (root / "inference").mkdir()
    (root / "inference" / "fam_assistant.py").write_text("")
    forms = {
        "a.py": "import megatron_mtp.models.fam.inner\n",
        "b.py": "from megatron_mtp.models.fam.inner import x\n",
        "c.py": "from megatron_mtp.models import fam\n",
        "d.py": "def f():\n    from megatron_mtp.models.fam import inner\n",
        "e.py": "T = 'megatron_mtp.models.fam.inner:Layer'\n",
        "models/g.py": "from .fam import inner\n",
    }
    for name, text in forms.items():
        (root / name).write_text(text)
    found, named = crossings(root, ["fam"]), family_named(root, ["fam"])
    assert sorted({line.split(" ")[0] for line in found}) == sorted(forms), found
    assert named == ["inference/fam_assistant.py"]


BASES = ("mla", "dsa", "gqa")
"""The shared bases, named as a family folder is."""
OWN_MODULES = {"dsa": {"stages"}, "gemma4": {"attention", "feed_forward", "specs", "rope"},
               "gemma4/assistant": {"attention", "block", "centroids"}}
"""Modules a folder holds beside the folder table's, each named for what it builds (models/README.md)."""


def folder_table() -> set[str]:
    """The module names of models/README.md's folder table (its section "A family folder")."""
    text = (PACKAGE / "models" / "README.md").read_text().split("## A family folder\n", 1)[1]
    rows = text.split("\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `(\w+)(?:\.py|/)` \|", rows, re.M))


def test_every_family_folder_names_its_modules_as_the_readme_table_does():
    """One module name per concept across the families and the bases (``sizes.py`` in each, never ``size.py``
    beside it): every module of a family folder, a base or a drafter package in one is named in the table or is
    one of the folder's own (OWN_MODULES)."""
    shape = folder_table()
    assert {"model_config", "hf_mapping", "hf_config", "hf_view", "sizes", "transformer_config", "model"} <= shape
    folders = [f.name for f in families()] + list(BASES)
    folders += [f"{name}/{sub.name}" for name in folders for sub in (PACKAGE / "models" / name).iterdir()
                if (sub / "__init__.py").is_file()]
    stray = [f"models/{folder}/{entry.name}" for folder in folders for entry in (PACKAGE / "models" / folder).iterdir()
             if (entry.suffix == ".py" or (entry / "__init__.py").is_file())
             and entry.stem not in shape | OWN_MODULES.get(folder, set())]
    assert not stray, stray
