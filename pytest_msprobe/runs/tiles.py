"""A contraction's bench-side runs computed in fixed tiles of its output, whole or in pieces.

A GEMM library may add an element's products in an order that depends on the shape of the call: torch's fp64 GEMM
does by the number of columns on an AMD EPYC, and on an Intel Xeon (MKL, AVX-512 and AMX) by the rows and columns
together: an fp64 linear of 300 rows in blocks of 256 columns gives other last bits than its 64-row pieces do, while
all 2,500 columns at once give the same. A check in pieces (check/chunked.py) computes a linear's or matmul's bench
on blocks of the output's rows and the weight's columns, so on such a host its bench would differ from the whole
check's in the last bits, and with it the statistics of outputs that cancel. Computing every bench-side run of a
contraction in tiles of ROWS x COLUMNS of its output, on the whole check as on its pieces (whose rows and columns
start on tile edges: runs/chunks.py), makes both call the library on the very same shapes, with the same values
at the same alignment: the results are the same whichever order the library takes for a shape. Only the bench's
side is cut; the device's call runs as the step ran it. A call that takes a gradient runs whole (its backward is
not checked in pieces).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

CONTRACTIONS = frozenset({"linear", "matmul", "mm"})  # cut along the first operand's rows, the second's columns
_OPERANDS = frozenset({"input", "self", "weight", "other", "mat2", "bias"})  # keywords of linear, matmul and mm
# output rows and columns per tile; a [2048, 4096] x [11008, 4096] fp32 linear takes 0.69-0.72 s in them, 0.55-0.58 s
# whole (2-core Intel Xeon, AVX-512, AMX, 2026-12-04)
ROWS = COLUMNS = 256


def aligned(columns: int) -> int:
    """`columns` rounded up to whole tiles: a piece's columns start and end where the whole run's tiles do."""
    return max(COLUMNS, -(-columns // COLUMNS) * COLUMNS)


def by_tiles(api: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` itself, or for a contraction `fn` computed ROWS x COLUMNS of its output at a time where it has more."""
    if api not in CONTRACTIONS:
        return fn

    @functools.wraps(fn)
    def tiled(*args: Any, **kwargs: Any) -> Any:
        cut = _operands(api, args, kwargs)
        if cut is None:
            return fn(*args, **kwargs)
        args_of, lead, rows, width = cut
        out = None
        for c0 in range(0, width, COLUMNS):
            for r0 in range(0, rows, ROWS):
                part = fn(*args_of(r0, min(rows, r0 + ROWS), c0, min(width, c0 + COLUMNS)))
                if out is None:
                    out = part.new_empty((rows, width))
                out[r0:r0 + ROWS, c0:c0 + COLUMNS] = part
                del part
        assert out is not None
        return out.reshape(*lead, width)

    return tiled


def argument(args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any], position: int, *names: str) -> Any:
    """A call's argument at `position`, else under the first of `names` given as a keyword; None without it."""
    if len(args) > position:
        return args[position]
    return next((kwargs[n] for n in names if n in kwargs), None)


def _operands(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[Callable[[int, int, int, int], tuple[Any, ...]], tuple[int, ...], int, int] | None:
    """The call's positional arguments for output rows r0..r1 and columns c0..c1, its leading shape, rows and width;
    None where it runs whole (one tile or less, a gradient taken, `out=`, operands other than a matrix times a 2-D
    weight)."""
    if len(args) > (3 if api == "linear" else 2) or set(kwargs) - _OPERANDS:
        return None
    x, w = argument(args, kwargs, 0, "input", "self"), argument(args, kwargs, 1, "weight", "other", "mat2")
    bias = argument(args, kwargs, 2, "bias") if api == "linear" else None
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or x.dim() < 2 or w.dim() != 2:
        return None
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1):
        return None
    width = w.shape[0] if api == "linear" else w.shape[1]
    lead, inner = tuple(x.shape[:-1]), x.shape[-1]
    rows = math.prod(lead)  # of the output, also where the inner dimension is empty
    if (rows <= ROWS and width <= COLUMNS) or not rows or not width or (torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in (x, w, bias))):
        return None
    flat = x.reshape(rows, inner)  # a view, but of a first operand laid out otherwise: a copy, as a piece's

    def args_of(r0: int, r1: int, c0: int, c1: int) -> tuple[Any, ...]:
        if api == "linear":
            return (flat[r0:r1], w[c0:c1]) + (() if bias is None else (bias[c0:c1],))
        return (flat[r0:r1], w[:, c0:c1].contiguous())  # a block laid out as a piece's cast copy of it is

    return args_of, lead, rows, width
