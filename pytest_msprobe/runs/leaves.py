"""Flattening an API result into its leaves, as msprobe orders outputs.

Below execution and torch_names, which both need it (torch_names to tell torch namesakes apart by
their outputs' shapes, execution for every run).
"""
from __future__ import annotations

from typing import Any

import torch


def output_leaves(value: Any) -> list[Any]:
    """Flatten an API result: tensors and Python scalars in order (namedtuples as tuples)."""
    out: list[Any] = []
    _leaves_into(value, out)
    return out


def _leaves_into(v: Any, out: list[Any]) -> None:  # module-level, not a closure: see execution._tensors_into
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        for x in v:
            _leaves_into(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _leaves_into(x, out)
    else:
        out.append(v)
