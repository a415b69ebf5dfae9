"""A contraction's bench-side runs computed a fixed block of output columns at a time, whole or in pieces.

A GEMM library may add a column's products in an order that depends on how many columns the call has: torch's
fp64 GEMM does on an AMD EPYC, and a bf16 linear's fp32 bench did on an Intel Xeon with AMX. A check in pieces
(check/chunked.py) computes a linear's or matmul's bench on a block of the weight's columns, so on such a host its
bench would differ from the whole check's in the last bits, and with it the statistics of outputs that cancel.
Computing every bench-side run of a contraction in blocks of COLUMNS columns, on the whole check as on its pieces
(whose columns are whole blocks: runs/chunks.py), makes both call the library on the very same shapes: the values
are the same whichever order the library takes. Only the bench's side is cut; the device's call runs as the step
ran it. A call that takes a gradient runs whole (its backward is not checked in pieces).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

CONTRACTIONS = frozenset({"linear", "matmul", "mm"})  # cut along the second operand's output columns
_OPERANDS = frozenset({"input", "self", "weight", "other", "mat2", "bias"})  # keywords of linear, matmul and mm
COLUMNS = 256  # output columns per block; a [2048, 4096] x [11008, 4096] fp32 linear takes as long in them as whole


def aligned(columns: int) -> int:
    """`columns` rounded up to whole blocks: a piece's columns start and end where the whole run's blocks do."""
    return max(COLUMNS, -(-columns // COLUMNS) * COLUMNS)


def by_columns(api: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` itself, or for a contraction `fn` computed COLUMNS output columns at a time where it has more."""
    if api not in CONTRACTIONS:
        return fn

    @functools.wraps(fn)
    def blocked(*args: Any, **kwargs: Any) -> Any:
        cut = _operands(api, args, kwargs)
        if cut is None:
            return fn(*args, **kwargs)
        args_of, width = cut
        first = fn(*args_of(0, COLUMNS))
        out = first.new_empty((*first.shape[:-1], width))
        out[..., :COLUMNS] = first
        del first
        for c0 in range(COLUMNS, width, COLUMNS):
            out[..., c0:c0 + COLUMNS] = fn(*args_of(c0, min(width, c0 + COLUMNS)))
        return out

    return blocked


def argument(args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any], position: int, *names: str) -> Any:
    """A call's argument at `position`, else under the first of `names` given as a keyword; None without it."""
    if len(args) > position:
        return args[position]
    return next((kwargs[n] for n in names if n in kwargs), None)


def _operands(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[Callable[[int, int], tuple[Any, ...]], int] | None:
    """The call's positional arguments for columns c0..c1, and its width; None where it runs whole (a width of one
    block or less, a gradient taken, `out=`, operands other than a matrix times a 2-D weight)."""
    if len(args) > (3 if api == "linear" else 2) or set(kwargs) - _OPERANDS:
        return None
    x, w = argument(args, kwargs, 0, "input", "self"), argument(args, kwargs, 1, "weight", "other", "mat2")
    bias = argument(args, kwargs, 2, "bias") if api == "linear" else None
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or x.dim() < 2 or w.dim() != 2:
        return None
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1):
        return None
    width = w.shape[0] if api == "linear" else w.shape[1]
    if width <= COLUMNS or (torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in (x, w, bias))):
        return None

    def args_of(c0: int, c1: int) -> tuple[Any, ...]:
        if api == "linear":
            return (x, w[c0:c1]) + (() if bias is None else (bias[c0:c1],))
        return (x, w[:, c0:c1].contiguous())  # a block laid out as a piece's cast copy of it is

    return args_of, width

