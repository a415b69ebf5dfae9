"""Seeing a training step's calls as it runs them: the part the online sender and the in-process check share.

`Capture(sink)` is a context manager. While it is entered, a `TorchFunctionMode` sees every `torch.*`,
`torch.nn.functional.*` and Tensor method call (only the outermost: what an API does inside is not seen) and
hands it to `sink(api, args, kwargs, out)` under msprobe's API name (`Functional.linear`, `Tensor.add_`).
`backward()` run inside the block is watched by a `TorchDispatchMode`, whose aten ops reach the sink as
`Aten.<op>`, as msprobe 8.1's online client sends them. With `level="aten"` the dispatch mode watches the
forward too, as msprobe's online_dispatch did, and only aten ops are seen.

An in-place call's first arguments are copied before the call (`sink` gets the input as it was). The sink
runs in the calling thread, with the modes off: nothing it runs is seen. What the step computes is what it
computes without the capture: the modes call each function with the arguments they were given.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

Sink = Callable[[str, Any, Any, Any], None]
LEVELS = ("api", "aten")

_FunctionMode: Any = TorchFunctionMode
_DispatchMode: Any = TorchDispatchMode

NOT_SEEN = ("backward", "register_hook", "retain_grad", "requires_grad_", "data_ptr")
ATEN_NOT_SEEN = ("detach", "alias")  # autograd's bookkeeping, not the model's arithmetic
# The Tensor operators msprobe's dumper names (its support_wrap_ops.yaml, less __bool__/__nonzero__, which are
# control flow, and __setitem__, whose result is its input; __rdiv__, which msprobe's dump names as the
# reciprocal and product torch computes it by, is one call here). torch hands a mode `Tensor.add` for `a + b`, so
# while a capture is entered each operator is wrapped to tell the mode its own name, as msprobe's own
# wrapping of Tensor's attributes names it.
OPERATORS = ("__add__", "__and__", "__div__", "__eq__", "__floordiv__", "__ge__", "__gt__", "__iadd__", "__iand__",
             "__idiv__", "__ifloordiv__", "__ilshift__", "__imod__", "__imul__", "__ior__", "__ipow__", "__irshift__",
             "__isub__", "__ixor__", "__le__", "__lshift__", "__lt__", "__matmul__", "__mod__", "__mul__", "__ne__",
             "__or__", "__pow__", "__radd__", "__rdiv__", "__rmod__", "__rmul__", "__ror__", "__rpow__", "__rshift__",
             "__rsub__", "__rxor__", "__sub__", "__truediv__", "__xor__")
IN_PLACE_OPERATORS = frozenset(name for name in OPERATORS if name.startswith("__i"))
_DUNDERS = ("__getitem__", *OPERATORS)
_hint = threading.local()  # the operator being called in this thread: (type, name)


def api_names() -> dict[Any, tuple[str, str]]:
    """func -> (msprobe API type, name) for the public functions of torch.nn.functional, torch and Tensor, and
    of torch_npu (`NPU.npu_rms_norm`) where the step has imported it (it is never imported here: without CANN
    it cannot be)."""
    table: dict[Any, tuple[str, str]] = {}
    owners: list[tuple[str, Any]] = [("Tensor", torch.Tensor), ("Torch", torch), ("Functional", torch.nn.functional)]
    if sys.modules.get("torch_npu") is not None:
        owners.insert(0, ("NPU", sys.modules["torch_npu"]))  # last wins: torch's own names keep their type
    for prefix, owner in owners:
        for name in dir(owner):
            if name.startswith("_") and name not in _DUNDERS or name in NOT_SEEN:
                continue
            fn = getattr(owner, name, None)
            if callable(fn) and not isinstance(fn, type):
                try:
                    table[fn] = (prefix, name)
                except TypeError:  # unhashable
                    pass
    return table


def plain_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords a check is given: `device` dropped (the check places the call itself, as msprobe's client
    drops it), and the defaults layout=torch.strided and memory_format=torch.preserve_format, which a dump
    cannot name."""
    return {k: v for k, v in kwargs.items() if k != "device" and v is not torch.strided
            and v is not torch.preserve_format}


def in_place(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") or name in IN_PLACE_OPERATORS


def _operator(original: Any, name: str) -> Any:
    def operator(*args: Any, **kwargs: Any) -> Any:
        _hint.name = ("Tensor", name)
        try:
            return original(*args, **kwargs)
        finally:
            _hint.name = None

    operator.__name__ = operator.__qualname__ = name
    return operator


def _take_hint() -> tuple[str, str] | None:
    hint: tuple[str, str] | None = getattr(_hint, "name", None)
    _hint.name = None
    return hint


class _Forward(_FunctionMode):  # type: ignore[misc]
    def __init__(self, capture: Capture) -> None:
        super().__init__()
        self.capture, self.depth = capture, 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        hint = _take_hint()  # an operator's name, for the call it makes
        named = (hint or self.capture.names.get(func)) if self.depth == 0 else None
        if named is None:
            return func(*args, **kwargs)
        self.depth += 1  # nothing the call (or the sink) runs is seen
        try:
            return self.capture.see(named[0], named[1], func, args, kwargs)
        finally:
            self.depth -= 1


class _Aten(_DispatchMode):  # type: ignore[misc]
    def __init__(self, capture: Capture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in ATEN_NOT_SEEN:
            return func(*args, **(kwargs or {}))
        return self.capture.see("Aten", name, func, args, kwargs or {})


class Capture:
    """The modes around a block of a training step; `wants(api)`, asked once per call before anything is copied,
    says whether that call reaches the sink (all by default), `backward` whether the step's backward is seen,
    `copy` how an in-place call's tensor arguments are copied before it runs (a clone where they are, by
    default)."""

    def __init__(self, sink: Sink, backward: bool = True, level: str = "api",
                 wants: Callable[[str], bool] | None = None, copy: Callable[[Any], Any] | None = None) -> None:
        if level not in LEVELS:
            raise ValueError(f"level={level!r}: one of {', '.join(LEVELS)}")
        self.sink, self.backward, self.level = sink, backward, level
        self.wants: Callable[[str], bool] = wants or (lambda api: True)
        self.copy: Callable[[Any], Any] = copy or (lambda t: t.detach().clone())
        self.names = api_names() if level == "api" else {}
        self._modes: list[Any] = []
        self._patched: Any = None
        self._operators: dict[str, Any] = {}  # name -> what torch.Tensor itself held (None: inherited)

    def __enter__(self) -> Capture:
        mode = _Forward(self) if self.level == "api" else _Aten(self)
        mode.__enter__()
        self._modes.append(mode)
        if self.level == "api":
            self._patch_operators()
        if self.backward and self.level == "api":
            self._patch_backward()
        return self

    def see(self, kind: str, name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run one call of `kind.name` and hand it to the sink if it is wanted, an in-place call's tensor
        arguments copied before it runs."""
        api = f"{kind}.{name}"
        if not self.wants(api):
            return func(*args, **kwargs)
        seen = tuple(self.copy(a) if isinstance(a, torch.Tensor) else a for a in args) if in_place(name) else args
        out = func(*args, **kwargs)
        self.sink(api, seen, kwargs, out)
        return out

    def __exit__(self, *exc: Any) -> None:
        if self._patched is not None:
            torch.autograd.backward = self._patched
            self._patched = None
        for name, own in self._operators.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        self._operators.clear()
        while self._modes:
            self._modes.pop().__exit__(None, None, None)

    def _patch_operators(self) -> None:
        for name in OPERATORS:
            original = getattr(torch.Tensor, name, None)
            if original is None:
                continue
            self._operators[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, _operator(original, name))

    def _patch_backward(self) -> None:
        original = torch.autograd.backward
        capture = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            forward = capture._modes[-1] if capture._modes else None
            if forward is not None:
                forward.depth += 1  # the function mode stays out of the backward
            try:
                with _Aten(capture):
                    return original(*args, **kwargs)
            finally:
                if forward is not None:
                    forward.depth -= 1

        self._patched = original
        torch.autograd.backward = backward  # Tensor.backward calls torch.autograd.backward
