"""Which inputs of a recorded call the API may write into: those each side must have a copy of.

Every other input is read only, so the sides that need it as it is (the CPU device side and torch's run on
the CPU, in the recorded dtype) take the drawn tensor itself (execution.Shared). What may be written is told
from the call, conservatively:

* aten's schema of the API's name (`Tensor(a!) self` is written), the union over its overloads: `add_`,
  `addcdiv_`, `index_put_`, `_foreach_add_` and the fused optimizers' steps (`_fused_adam_` writes its
  parameters and moments); a trailing underscore without an aten op of that name writes every input;
* `__i<op>__` (`__iadd__`) and `__setitem__` write `self`; `out=` writes its tensors; `inplace=True`
  (keyword or positional, through the Python signature) writes the first input;
* api_specs/apis.yaml `changes_inputs`: APIs that write an input although neither their name nor their
  schema says so (batch_norm's running statistics in training; embedding's `max_norm` renormalises rows
  of its weight in place), always or when a named argument is given.

APIs of other types (NPU, MindSpore) share nothing. torch's version counters are the safety net behind
this (execution.Shared.changed).
"""
from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Collection
from typing import Any, Callable

import torch

from ..dump.reader import iter_leaves
from .execution import tensors_of

_INPLACE_DUNDER = re.compile(r"__i(add|sub|mul|matmul|truediv|floordiv|div|mod|pow|lshift|rshift|and|or|xor)__")
_TYPES = ("Tensor", "Torch", "Functional", "Aten")


def written_inputs(api_type: str, api_name: str, fn: Callable[..., Any] | None, args: list[Any],
                   kwargs: dict[str, Any], specs: dict[str, Any]) -> set[int] | None:
    """The ids of the input tensors the call may write into, or None when it cannot be told (every side then
    copies every input). `fn` is torch's callable of the API (its Python signature names positional
    arguments such as `inplace`)."""
    if api_type not in _TYPES:
        return None
    rule = (specs.get("changes_inputs") or {}).get(api_name, False)
    if rule is None or (isinstance(rule, str) and _argument(fn, args, kwargs, rule) not in (None, False)):
        return None
    positions: set[int] = set()
    names = {"out"}
    if _INPLACE_DUNDER.fullmatch(api_name) or api_name == "__setitem__":
        positions.add(0)
    elif not api_name.startswith("__"):
        schema = _aten_writes(api_name)
        if schema is None and api_name.endswith("_"):
            return None  # in place, but where cannot be told
        if schema is not None:
            positions |= schema[0]
            names |= schema[1]
        if api_name.endswith("_") and api_type == "Tensor":
            positions.add(0)
    if _argument(fn, args, kwargs, "inplace") is True:
        positions.add(0)
    written = [a for i, a in enumerate(args) if i in positions] + [v for k, v in kwargs.items() if k in names]
    return {id(t) for t in tensors_of(written)}


def may_grow(api_name: str, args: list[Any], kwargs: dict[str, Any], written: Collection[int] | None,
             output: Any = None) -> bool:
    """Whether the call may grow the storage of an input it writes (`resize_`, `resize_as_`, an `out=` of
    another shape, an in-place call whose recorded `output` has more elements than an input whose id is in
    `written`, written_inputs' set: torch resizes the `self` of addbmm_ to the product's shape): such an input
    is never given to a side as it was built, since a drawn tensor lives in numpy's memory, which torch cannot
    resize (inputs/build._empty); the side gets a copy in torch's."""
    if api_name in ("resize_", "resize_as_") or "out" in kwargs:
        return True
    shapes = [leaf["shape"] for leaf in iter_leaves(output)
              if isinstance(leaf, dict) and isinstance(leaf.get("shape"), list)]
    largest = max((math.prod(int(n) for n in shape) for shape in shapes), default=0)
    return any(t.numel() < largest for t in tensors_of((args, kwargs)) if id(t) in (written or ()))


@functools.cache
def _aten_writes(name: str) -> tuple[frozenset[int], frozenset[str]] | None:
    """(positions, names) of the arguments any overload of aten's `name` writes (`Tensor(a!)`), or None when
    aten has no op of that name."""
    packet = getattr(torch.ops.aten, name.split(".")[0], None)
    if packet is None or not hasattr(packet, "overloads"):
        return None
    positions: set[int] = set()
    names: set[str] = set()
    for overload in packet.overloads():
        for i, arg in enumerate(getattr(packet, overload)._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                names.add(arg.name)
                if not arg.kwarg_only:
                    positions.add(i)
    return frozenset(positions), frozenset(names)


def _argument(fn: Callable[..., Any] | None, args: list[Any], kwargs: dict[str, Any], name: str) -> Any:
    """The value the call passes for the parameter `name` (by keyword, or by position through `fn`'s Python
    signature), or None."""
    if name in kwargs:
        return kwargs[name]
    signature = _signature(fn)
    if signature is None or name not in signature.parameters:
        return None
    try:
        return signature.bind_partial(*args).arguments.get(name)
    except TypeError:
        return None


@functools.cache
def _signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a Python signature
        return None


def _signature(fn: Callable[..., Any] | None) -> inspect.Signature | None:
    if fn is None:
        return None
    try:
        return _signature_of(fn)
    except TypeError:  # not hashable
        return None
