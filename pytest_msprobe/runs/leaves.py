"""Flattening an API result into its leaves, as msprobe orders outputs, and walking a call's values.

Below execution and torch_names, which both need it (torch_names to tell torch namesakes apart by
their outputs' shapes, execution for every run), and light: a training process that captures calls
(online/, inprocess/) walks their values with it without importing the checks.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def output_leaves(value: Any) -> list[Any]:
    """Flatten an API result: tensors and Python scalars in order (namedtuples as tuples)."""
    out: list[Any] = []
    _leaves_into(value, out)
    return out


def _leaves_into(v: Any, out: list[Any]) -> None:  # module-level, not a closure: see _tensors_into
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        for x in v:
            _leaves_into(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _leaves_into(x, out)
    else:
        out.append(v)


def tensors_of(value: Any) -> list[torch.Tensor]:
    """Tensor leaves in argument order (lists, tuples and dict values)."""
    out: list[torch.Tensor] = []
    _tensors_into(value, out)
    return out


def _tensors_into(v: Any, out: list[torch.Tensor]) -> None:
    # A module-level recursion: a nested `def walk` refers to itself through its closure, a reference
    # cycle that keeps `out`, and every tensor in it, alive until the cyclic GC runs (hundreds of MB).
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _tensors_into(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _tensors_into(x, out)


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, list):
        return [map_structure(fn, v) for v in value]
    if isinstance(value, tuple):
        return tuple(map_structure(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: map_structure(fn, v) for k, v in value.items()}
    return fn(value)
