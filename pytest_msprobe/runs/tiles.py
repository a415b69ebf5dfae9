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
side is cut; the device's call runs as the step ran it. A call that takes a gradient computes its gradients, each
a product of two matrices, in the tiles of that product (`_Tiled`), as a backward item's pieces do.
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


def by_tiles(api: str, fn: Callable[..., Any], gradients: bool = True) -> Callable[..., Any]:
    """`fn` itself, or for a contraction `fn` computed ROWS x COLUMNS of its output at a time where it has more; a
    call that takes a gradient gets its gradients in tiles too (`_Tiled`), as a backward item's pieces compute them
    (check/chunked.py), unless `gradients` is false: there it runs whole, under torch's own autograd node (a
    replayed item's recorded gradients are that node's slots)."""
    if api not in CONTRACTIONS:
        return fn

    @functools.wraps(fn)
    def tiled(*args: Any, **kwargs: Any) -> Any:
        found = operands(api, args, kwargs) if gradients and torch.is_grad_enabled() else None
        if found is not None and any(t.requires_grad for t in found):
            return _Tiled.apply(api, fn, *found)  # type: ignore[no-untyped-call]
        cut = _operands(api, args, kwargs)
        if cut is None:
            return fn(*args, **kwargs)
        return _in_tiles(fn, *cut)

    return tiled


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of two matrices in the tiles of its output: a gradient of a contraction, whole or a piece of it. One
    tile's operands are laid out as every tile's are (contiguous): a GEMM library may sum a transposed operand in
    another order."""
    cut = _operands("matmul", (a, b), {})
    return torch.matmul(a.contiguous(), b.contiguous()) if cut is None else _in_tiles(torch.matmul, *cut)


def gradient_operands(api: str, position: int, grad: torch.Tensor, x: torch.Tensor,
                      w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two matrices whose product (`matmul`) is the gradient of a contraction's operand `position` (0: its
    input, 1: its weight), given the gradient of its output `grad`: views, nothing copied."""
    g, flat = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
    if position == 0:
        return g, (w if api == "linear" else w.t())
    return (g.t(), flat) if api == "linear" else (flat.t(), g)


class _Tiled(torch.autograd.Function):
    """A contraction whose output and gradients are computed in tiles: dX = dY W (linear) or dY W^T, dW = dY^T X
    (linear) or X^T dY, each in `matmul`'s tiles of its own output, and a bias's gradient dY summed over rows."""

    @staticmethod
    def forward(ctx: Any, api: str, fn: Callable[..., Any], x: torch.Tensor, w: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        ctx.api = api
        ctx.save_for_backward(x, w)
        args = (x, w) if bias is None else (x, w, bias)
        cut = _operands(api, args, {})
        return fn(*args) if cut is None else _in_tiles(fn, *cut)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        grads: list[torch.Tensor | None] = [None, None]
        for position, wanted in enumerate(ctx.needs_input_grad[2:4]):
            grads.append(matmul(*gradient_operands(ctx.api, position, grad, x, w)).reshape(
                (x if position == 0 else w).shape) if wanted else None)
        wants_bias = len(ctx.needs_input_grad) > 4 and ctx.needs_input_grad[4]
        return (*grads, grad.reshape(-1, grad.shape[-1]).sum(0) if wants_bias else None)


def operands(api: str, args: Any, kwargs: dict[str, Any]) -> tuple[torch.Tensor, ...] | None:
    """A contraction's operands (input, weight[, bias]) where `_Tiled` differentiates them, else None."""
    found = _standard(api, tuple(args), kwargs)
    return found if found is not None and _matrices(*found) else None


def _standard(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call's operands (input, weight[, bias]) by position, None where it has other arguments."""
    if len(args) > (3 if api == "linear" else 2) or set(kwargs) - _OPERANDS:
        return None
    x, w = argument(args, kwargs, 0, "input", "self"), argument(args, kwargs, 1, "weight", "other", "mat2")
    bias = argument(args, kwargs, 2, "bias") if api == "linear" else None
    return (x, w) if bias is None else (x, w, bias)


def _matrices(x: Any, w: Any, bias: Any = None) -> bool:
    return isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() >= 2 and w.dim() == 2 and \
        (bias is None or (isinstance(bias, torch.Tensor) and bias.dim() == 1))


def _in_tiles(fn: Callable[..., Any], args_of: Callable[[int, int, int, int], tuple[Any, ...]],
              lead: tuple[int, ...], rows: int, width: int) -> torch.Tensor:
    out: torch.Tensor | None = None
    for c0 in range(0, width, COLUMNS):
        for r0 in range(0, rows, ROWS):
            part = fn(*args_of(r0, min(rows, r0 + ROWS), c0, min(width, c0 + COLUMNS)))
            if out is None:
                out = part.new_empty((rows, width))
            out[r0:r0 + ROWS, c0:c0 + COLUMNS] = part
            del part
    assert out is not None
    return out.reshape(*lead, width)


def argument(args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any], position: int, *names: str) -> Any:
    """A call's argument at `position`, else under the first of `names` given as a keyword; None without it."""
    if len(args) > position:
        return args[position]
    return next((kwargs[n] for n in names if n in kwargs), None)


def _operands(api: str, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[Callable[[int, int, int, int], tuple[Any, ...]], tuple[int, ...], int, int] | None:
    """The call's positional arguments for output rows r0..r1 and columns c0..c1, its leading shape, rows and width;
    None where it runs whole (one tile or less, a gradient taken outside `_Tiled`, `out=`, operands other than a
    matrix times a 2-D weight)."""
    operands = _standard(api, args, kwargs)
    if operands is None or not _matrices(*operands):
        return None
    x, w, bias = (*operands, None)[:3]
    width = w.shape[0] if api == "linear" else w.shape[1]
    lead, inner = tuple(x.shape[:-1]), x.shape[-1]
    rows = math.prod(lead)  # of the output, also where the inner dimension is empty
    if (rows <= ROWS and width <= COLUMNS) or not rows or not width or (torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in (x, w, bias))):
        return None
    flat = x.reshape(rows, inner)  # a view, but of a first operand laid out otherwise: a copy, as a piece's

    def args_of(r0: int, r1: int, c0: int, c1: int) -> tuple[Any, ...]:
        if api == "linear":  # a block laid out as a piece's cast copy of it is (a transposed gradient's rows too)
            return (flat[r0:r1].contiguous(), w[c0:c1]) + (() if bias is None else (bias[c0:c1],))
        return (flat[r0:r1].contiguous(), w[:, c0:c1].contiguous())

    return args_of, lead, rows, width
