"""JSON that every parser accepts: a non-finite float (NaN, Inf) is written as null, never as the
bare NaN/Infinity Python's json module emits by default."""

from __future__ import annotations

import json
import math
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    return json.dumps(_clean(value), allow_nan=False, **kwargs)
