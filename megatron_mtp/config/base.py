"""Typed config machinery: nested dataclasses, YAML, dotted overrides, field docstrings.

Order of application (documented for users in the README):
  1. defaults of the dataclasses,
  2. the YAML file,
  3. dotted ``key.path=value`` overrides from the command line, left to right.
Unknown keys at any level are errors naming the closest valid key. Values are parsed with YAML
rules (``a.b=3`` is an int, ``a.b=[1,2]`` a list, ``a.b=null`` None) and then type-checked.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import re
import textwrap
import types
import typing
from typing import Any

import yaml

from megatron_mtp.errors import UserError


class _Loader(yaml.SafeLoader):
    """YAML with numbers as people write them: 1e4, 3e-4 and 10e12 are floats (YAML 1.2), where
    PyYAML's YAML 1.1 rules want a dot and a signed exponent (1.0e+4) and read the rest as text."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text):
    """yaml.safe_load with YAML 1.2 floats (see _Loader)."""
    return yaml.load(text, Loader=_Loader)


OTHER_SPELLINGS = {
    "context_parallel": "context parallelism is parallel.context (CP)",
}
"""Keys users of Megatron-LM reach for whose capability this project spells otherwise: the answer names
it instead of suggesting a near spelling of another field."""


def _closest(name: str, choices: list[str]) -> str:
    if name in OTHER_SPELLINGS and name not in choices:
        return f": {OTHER_SPELLINGS[name]}"
    match = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else f"; valid keys: {', '.join(sorted(choices))}"


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written right under each dataclass field (the torchtitan convention), a subclass's
    over those of the classes it extends."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert one YAML value against a field annotation."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(errors[0] if errors else f"{where} cannot be null")
    if origin is typing.Literal:
        if value is False and "off" in args:  # YAML reads a bare off (or no) as false
            value = "off"
        if value not in args:
            raise UserError(f"{where} is {value!r}; it must be one of {', '.join(repr(a) for a in args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a mapping of {_type_name(tp)} fields, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where} must be a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise UserError(f"{where} must have {len(args)} entries, got {len(value)}")
            return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        seq = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(seq) if origin is tuple else seq
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if value is None:
        raise UserError(f"{where} cannot be null; give a {_type_name(tp)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise UserError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise UserError(f"{where} is {value}; it must be a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise UserError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def resolve_section(cls: type, data: dict[str, Any], where: str) -> tuple[type, dict[str, Any]]:
    """The class a section's mapping builds and the mapping to build it from: ``cls`` itself, or what
    its ``__config_class__(data, where)`` says (config.model.ModelConfig: the family's subclass; MTPConfig: the
    one with the MTP styles' option sections)."""
    resolve = getattr(cls, "__config_class__", None)
    return resolve(data, where) if resolve is not None else (cls, data)


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with the closest valid name."""
    cls, data = resolve_section(cls, data, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise UserError(f"unknown config key '{path}'{_closest(str(key), list(fields))}")
        kwargs[key] = _coerce(value, hints[key], path)
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Plain-YAML form of a config (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def apply_override(data: dict[str, Any], cls: type, override: str) -> None:
    """Apply one ``a.b.c=value`` override to the raw mapping ``data`` (validated against ``cls``)."""
    if "=" not in override:
        raise UserError(f"override '{override}' must look like key.path=value")
    path, raw = override.split("=", 1)
    keys = path.strip().split(".")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise UserError(f"override '{override}': the value is not valid YAML ({exc.problem})") from None
    node, node_cls, walked = data, cls, []
    for i, key in enumerate(keys):
        if walked:
            node_cls, _ = resolve_section(node_cls, node, ".".join(walked))
        fields = {f.name: f for f in dataclasses.fields(node_cls)}
        walked.append(key)
        if key not in fields:
            foreign = getattr(node_cls, "__foreign_key__", None)  # ModelConfig: another family's field
            reason = foreign(key, node, ".".join(walked[:-1])) if foreign else None
            if reason:
                raise UserError(reason)
            raise UserError(
                f"unknown config key '{'.'.join(walked)}' in override '{override}'{_closest(key, list(fields))}"
            )
        if i == len(keys) - 1:
            node[key] = value
            return
        sub_cls = typing.get_type_hints(node_cls)[key]
        sub_args = [a for a in typing.get_args(sub_cls) if a is not type(None)]
        if not dataclasses.is_dataclass(sub_cls) and sub_args and dataclasses.is_dataclass(sub_args[0]):
            sub_cls = sub_args[0]
        if not dataclasses.is_dataclass(sub_cls):
            raise UserError(f"config key '{'.'.join(walked)}' is not a section; override it as a whole")
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node, node_cls = node[key], sub_cls


def load_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = parse_yaml(fh)
    except FileNotFoundError:
        raise UserError(f"config file '{path}' does not exist") from None
    except IsADirectoryError:
        raise UserError(f"config file '{path}' is a directory; pass a YAML file (e.g. configs/tiny_cpu.yaml)") from None
    except PermissionError:
        raise UserError(f"config file '{path}' cannot be read (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"config file '{path}' is not UTF-8 text (byte {exc.start} cannot be decoded); save it as "
                        "UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"config file '{path}' is not valid YAML{line}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        raise UserError(f"config file '{path}' is empty; write the sections to change (configs/tiny_cpu.yaml is an "
                        "example), or pass no config file for the defaults")
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}' must hold a mapping of sections at the top level")
    return data


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, type, docstring) for every leaf field: used by `megatron-mtp train --help-config`. A class's
    ``field_help()`` (field -> text), where it has one, adds what its docstrings cannot know (the registered
    choices); its ``__config_sections__()`` (section -> (class, the setting it belongs to)), the sections its
    ``__config_class__`` adds (config/model.py MTPConfig: each MTP style's options)."""
    rows = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    more = cls.field_help() if hasattr(cls, "field_help") else {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key + "."))
            sections = getattr(tp, "__config_sections__", None)  # MTPConfig: each style's own options
            for name, (sub, setting) in (sections() if sections else {}).items():
                rows.extend((k, t, f"[{setting}] {d}") for k, t, d in describe(sub, f"{key}.{name}."))
            variants = getattr(tp, "__config_classes__", None)  # ModelConfig: each family's own fields
            for name, sub in (variants() if variants else {}).items():
                rows.extend((k, t, f"[{f.name}.family={name}] {d}") for k, t, d in describe(sub, key + ".")
                            if k[len(key) + 1:].split(".")[0] not in {g.name for g in dataclasses.fields(tp)})
        else:
            rows.append((key, _type_name(tp), " ".join(d for d in (docs.get(f.name, ""), more.get(f.name)) if d)))
    return rows
