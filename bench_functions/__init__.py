"""Pure-torch references for torch_npu fused ops, looked up by op name.

Each function has the torch_npu signature and is called with the bench's raised-precision
CPU arguments (and, when the device is not an NPU, with the recorded-dtype device arguments).
"""
from __future__ import annotations

from typing import Any, Callable

_REGISTRY: dict[str, Callable[..., Any]] = {}


class BenchUnsupported(Exception):
    """The reference cannot reproduce this call (e.g. dropout with keep_prob < 1); the item skips."""


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make `fn` the reference of the torch_npu op `name`."""

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[name] = fn
        return fn

    return add


def get(name: str) -> Callable[..., Any] | None:
    _load_builtins()
    return _REGISTRY.get(name)


def names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def _load_builtins() -> None:
    from . import activations, norms  # noqa: F401  (registration happens at import)
