"""References to ``"package.module:name"`` imported when first called: how a registered object (a model family,
an MTP style) names members that need torch, megatron-core or a higher package without importing them when it is
registered (naming one for ``--help``, ``plan`` or a config check imports neither)."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_object(target: str) -> Callable[[], Any]:
    """A callable returning ``"package.module:name"`` itself (a class to build or subclass), imported when first
    called."""
    module, _, name = target.partition(":")
    cache: list[Any] = []

    def resolve() -> Any:
        if not cache:
            cache.append(getattr(importlib.import_module(module), name))
        return cache[0]

    resolve.__qualname__ = resolve.__name__ = name
    resolve.__doc__ = f"{target} (imported when first called)"
    return resolve


def lazy(target: str) -> Callable[..., Any]:
    """A callable standing for ``"package.module:name"``, imported when first called."""
    resolve = lazy_object(target)

    def call(*args, **kwargs):
        return resolve()(*args, **kwargs)

    call.__qualname__ = call.__name__ = resolve.__name__
    call.__doc__ = resolve.__doc__
    return call


def lazy_module(name: str) -> Callable[[], Any]:
    """A callable returning the module ``name``, imported when first called."""

    def resolve():
        return importlib.import_module(name)

    resolve.__qualname__ = resolve.__name__ = name.rpartition(".")[2]
    resolve.__doc__ = f"{name} (imported when first called)"
    return resolve
