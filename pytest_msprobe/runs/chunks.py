"""Runs of a large call in pieces: the bench, the third run and the magnitude run, a block of the output's rows at
a time (and, for a contraction with a large weight, a block of its columns within that).

Where each row of an API's output depends only on the same row of its inputs (a linear's or matmul's tokens, a
pointwise op's elements, a softmax's or norm's leading dimensions), the runs that the check computes beside the
device output need not exist whole: the host's passes (check/chunked.py) read each piece once, in the output's
flat order, and keep only their statistics. Each piece is computed by the very kernel the whole run would use, on
the same values: rows come in multiples of ROW_MULTIPLE (a short tail joins the block before it), so a vectorised
pointwise loop's tail falls where the whole's does. A contraction's rows and columns are cut only at the edges of
the tiles its bench-side runs are computed in, whole or not (tiles.py), so a GEMM library whose sums depend on the
shape of the call gives the pieces the whole run's values: the pieces are bitwise the whole run's
(tests/test_chunks.py).

Nothing here runs at plugin load: the module is imported by the check when an item does not fit its budget.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .execution import Side, Target, backward, make_side, map_structure, run_side, tensors_of
from .tiles import CONTRACTIONS, ROWS, aligned, argument

ROW_MULTIPLE = 64  # rows per block are a multiple of this, and no block is shorter (but a whole output)
POINTWISE = frozenset({
    "add", "sub", "mul", "div", "true_divide", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh",
    "silu", "gelu", "relu", "pow", "square", "reciprocal", "sin", "cos", "erf", "maximum", "minimum", "addcmul",
    "addcdiv", "lerp", "clamp", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__neg__", "__pow__",
    # in place (an optimizer's step): each side writes into its own copy of the inputs, a piece into its piece's
    "add_", "sub_", "mul_", "div_", "addcmul_", "addcdiv_", "lerp_", "__iadd__", "__isub__", "__imul__",
})
ROWWISE = frozenset({"softmax", "log_softmax", "layer_norm", "rms_norm"})  # normalised over trailing dimensions
COVERED = POINTWISE | ROWWISE | CONTRACTIONS


@dataclass(frozen=True)
class Chunking:
    """How one call's output splits: `rows` rows of `width` elements (the output's flat order), and `pieces(r0, r1,
    c0, c1)` the call's arguments for rows r0..r1 and columns c0..c1 (columns split only where `columns` is true);
    a block's rows are a multiple of `multiple`."""

    api: str
    rows: int
    width: int
    columns: bool
    pieces: Callable[[int, int, int, int], tuple[list[Any], dict[str, Any]]]
    multiple: int = ROW_MULTIPLE
    split: frozenset[int] = frozenset()  # ids of the tensors cut with the rows (a pointwise op's, a softmax's input)


def _put(args: list[Any], kwargs: dict[str, Any], position: int, name: str, value: Any) -> None:
    if len(args) > position:
        args[position] = value
    else:
        kwargs[name] = value


def plan(api: str, args: list[Any], kwargs: dict[str, Any], out_shape: tuple[int, ...] | None) -> Chunking | None:
    """How this forward call's output splits into independent rows, or None where it does not (an API outside
    COVERED, arguments whose rows are not the output's, an output of one row)."""
    if api not in COVERED or out_shape is None or len(out_shape) == 0 or "out" in kwargs:
        return None
    x = argument(args, kwargs, 0, "input", "self")
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return None
    width = int(out_shape[-1]) if len(out_shape) > 1 else 1
    rows = math.prod(out_shape) // max(width, 1)
    if rows < 2 * ROW_MULTIPLE or width == 0:
        return None
    if api in CONTRACTIONS:
        return _contraction(api, args, kwargs, x, rows, width)
    if api in ROWWISE:
        return _rowwise(api, args, kwargs, x, out_shape, (rows, width))
    return _pointwise(api, args, kwargs, tuple(out_shape), rows, width)


def _contraction(api: str, args: list[Any], kwargs: dict[str, Any], x: torch.Tensor, rows: int,
                 width: int) -> Chunking | None:
    other = argument(args, kwargs, 1, "weight", "other", "mat2")
    if not isinstance(other, torch.Tensor) or other.dim() != 2 or x.dim() < 2:
        return None
    inner = x.shape[-1]
    if api == "linear":
        bias = argument(args, kwargs, 2, "bias")
        if other.shape != (width, inner) or (bias is not None and (not isinstance(bias, torch.Tensor) or
                                                                    bias.shape != (width,))):
            return None
    elif other.shape != (inner, width):
        return None

    def pieces(r0: int, r1: int, c0: int, c1: int) -> tuple[list[Any], dict[str, Any]]:
        a, k = list(args), dict(kwargs)
        _put(a, k, 0, "input", x.reshape(-1, inner)[r0:r1])
        if api == "linear":
            _put(a, k, 1, "weight", other[c0:c1])
            bias = argument(args, kwargs, 2, "bias")
            if bias is not None:
                _put(a, k, 2, "bias", bias[c0:c1])
        else:
            _put(a, k, 1, "other" if "other" in kwargs else "mat2", other[:, c0:c1])
        return a, k

    return Chunking(api, rows, width, True, pieces, ROWS)  # blocks start on the bench's tiles


def _rowwise(api: str, args: list[Any], kwargs: dict[str, Any], x: torch.Tensor, out_shape: tuple[int, ...],
             size: tuple[int, int]) -> Chunking | None:
    """Row blocks of a softmax or norm over the last dimension; `size` is (rows, width) of the output."""
    rows, width = size
    if tuple(x.shape) != tuple(out_shape):
        return None
    if api in ("softmax", "log_softmax"):
        dim = argument(args, kwargs, 1, "dim")
        if not isinstance(dim, int) or dim not in (-1, x.dim() - 1):
            return None
        trailing: tuple[int, ...] = (width,)
    else:
        normalized = argument(args, kwargs, 1, "normalized_shape")
        trailing = tuple(int(n) for n in normalized) if isinstance(normalized, (list, tuple)) else ()
        if trailing != (width,):  # over several trailing dimensions: a block would have to be whole slices
            return None

    def pieces(r0: int, r1: int, c0: int, c1: int) -> tuple[list[Any], dict[str, Any]]:
        a, k = list(args), dict(kwargs)
        _put(a, k, 0, "input", x.reshape(-1, width)[r0:r1])
        return a, k

    return Chunking(api, rows, width, False, pieces, split=frozenset({id(x)}))


def _pointwise(api: str, args: list[Any], kwargs: dict[str, Any], out_shape: tuple[int, ...], rows: int,
               width: int) -> Chunking | None:
    """Tensors of the output's shape are split; 0-d ones and 1-d ones along the last dimension broadcast whole."""
    split: list[tuple[str, Any]] = []
    ok = [True]

    def classify(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if tuple(v.shape) == out_shape:
                split.append(("", v))
            elif not (v.dim() == 0 or (v.dim() == 1 and v.shape[0] in (1, width) and len(out_shape) > 1)):
                ok[0] = False
        return v

    map_structure(classify, [args, kwargs])
    if not ok[0] or not split:
        return None
    ids = {id(v) for _, v in split}

    def pieces(r0: int, r1: int, c0: int, c1: int) -> tuple[list[Any], dict[str, Any]]:
        def cut(v: Any) -> Any:
            return v.reshape(-1, width)[r0:r1] if isinstance(v, torch.Tensor) and id(v) in ids else v

        return [map_structure(cut, a) for a in args], {k: map_structure(cut, v) for k, v in kwargs.items()}

    return Chunking(api, rows, width, False, pieces, split=frozenset(ids))


def blocks(total: int, per_block: int, multiple: int = ROW_MULTIPLE) -> list[tuple[int, int]]:
    """[0, total) in blocks of `per_block` (rounded down to a multiple of `multiple`, at least one multiple), a
    tail shorter than `multiple` joined to the block before it."""
    size = max(multiple, per_block // multiple * multiple)
    edges = list(range(0, total, size)) + [total]
    if len(edges) > 2 and edges[-1] - edges[-2] < multiple:
        del edges[-2]
    return list(zip(edges[:-1], edges[1:]))


@dataclass(frozen=True)
class Gradient:
    """What a backward run in pieces gives: the gradient of tensor argument `position` (as make_side counts them),
    every argument at `positions` taking one, from the output's gradient `cotangent` cut with the rows."""

    position: int
    positions: frozenset[int]
    cotangent: torch.Tensor


@dataclass(frozen=True)
class RunSpec:
    """One of the runs computed in pieces: its name, function and the arguments it splits (`chunking`), the dtype
    each tensor is cast to, whether its inputs are taken as absolute values (the magnitude run; with the scalar
    arguments named in `scalars`), its autocast dtype, the torch device it runs on and, for a backward item's run,
    the gradient it gives (a row-local one: the call's backward on the piece)."""

    name: str
    fn: Any
    chunking: Chunking
    dtype_for: Callable[[torch.Tensor], torch.dtype]
    absolute: bool = False
    scalars: frozenset[str] = frozenset()
    autocast: torch.dtype | None = None
    device: str = "cpu"
    gradient: Gradient | None = None


def piece_bytes(spec: RunSpec, rows: int, columns: int) -> int:
    """Bytes one piece of `rows` rows and `columns` columns holds while it runs: its inputs' cast copies (and their
    absolute values, for the magnitude run), its output and, for a contraction, the buffer a GEMM library packs
    its largest operand into (measured: the fp32 linear's pieces exceeded their budget by about that much)."""
    args, kwargs = spec.chunking.pieces(0, min(rows, spec.chunking.rows), 0, min(columns, spec.chunking.width))
    casts: list[int] = []  # each tensor's cast copy
    absolutes = [0]  # and, for the magnitude run, its absolute values

    def count(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            wide = spec.dtype_for(v) if v.is_floating_point() else v.dtype
            casts.append(v.numel() * wide.itemsize)
            absolutes[0] += v.numel() * v.dtype.itemsize if spec.absolute else 0
        return v

    map_structure(count, [args, kwargs])
    packed = max(casts, default=0) if spec.chunking.api in CONTRACTIONS else 0
    out = rows * columns * output_itemsize(spec)
    # a backward run also holds the output's gradient, the graph's saved tensors and the gradients: 3x, measured
    return (sum(casts) + absolutes[0] + packed + out) * (1 if spec.gradient is None else 3)


def output_dtype(spec: RunSpec) -> torch.dtype:
    """The dtype of the run's output: its first tensor argument's, as the run casts it."""
    x = next((v for v in spec.chunking.pieces(0, 1, 0, 1)[0] if isinstance(v, torch.Tensor)), None)
    return spec.dtype_for(x) if x is not None and x.is_floating_point() else torch.float32


def output_itemsize(spec: RunSpec) -> int:
    """Bytes per element of the run's output."""
    return output_dtype(spec).itemsize


def run_piece(spec: RunSpec, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
    """Rows r0..r1, columns c0..c1 of `spec`'s output, as a 2-D tensor where the run computed it."""
    args, kwargs = spec.chunking.pieces(r0, r1, c0, c1)
    if spec.absolute:
        def absolute(v: Any) -> Any:
            return v.abs() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

        args = [map_structure(absolute, a) for a in args]
        kwargs = {k: abs(v) if k in spec.scalars and isinstance(v, (int, float)) else map_structure(absolute, v)
                  for k, v in kwargs.items()}
    gradient = spec.gradient
    positions = gradient.positions if gradient is not None else frozenset()
    tensors = tensors_of([args, kwargs])
    side: Side = make_side(args, kwargs, target=Target(spec.device, spec.dtype_for, spec.device == "cpu"),
                           requires_grad={id(t) for i, t in enumerate(tensors) if i in positions},
                           want_grad=gradient is not None)
    out = run_side(spec.fn, side, autocast=spec.autocast, device_type=spec.device.split(":")[0],
                   grad=gradient is not None)
    leaf = out[0] if isinstance(out, (list, tuple)) else out
    if not isinstance(leaf, torch.Tensor):
        raise TypeError(f"the {spec.name} run of {spec.chunking.api} returned {type(leaf).__name__}, not a tensor")
    if gradient is not None:  # as the whole side's backward (execution.backward): the output's gradient in its dtype
        backward([leaf], [(0, gradient.cotangent.reshape(-1, spec.chunking.width)[r0:r1])], spec.device)
        grad = dict(side.grad_leaves)[gradient.position].grad
        if grad is None:
            raise TypeError(f"the {spec.name} run of {spec.chunking.api} gave no gradient of tensor argument "
                            f"{gradient.position}")
        leaf = grad
    return leaf.detach().reshape(r1 - r0, c1 - c0)


def run_rows(spec: RunSpec, r0: int, r1: int, columns: int) -> torch.Tensor:
    """Rows r0..r1 of `spec`'s output on the host (`columns` per piece: the whole width, or blocks of it, rounded
    up to the bench's blocks of columns)."""
    chunking = spec.chunking
    columns = aligned(columns)
    if columns >= chunking.width or not chunking.columns:
        return run_piece(spec, r0, r1, 0, chunking.width).cpu()
    out = None
    for c0 in range(0, chunking.width, columns):
        c1 = min(chunking.width, c0 + columns)
        part = run_piece(spec, r0, r1, c0, c1).cpu()
        if out is None:
            out = torch.empty((r1 - r0, chunking.width), dtype=part.dtype)
        out[:, c0:c1] = part
        del part
    assert out is not None
    return out


def pieces_of(specs: list[RunSpec], rows: int, columns: int) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """Each block of `rows` rows: its first element's flat index and every run's output there (flat, on the host)."""
    first = specs[0].chunking
    for r0, r1 in blocks(first.rows, rows, first.multiple):
        yield r0 * first.width, {s.name: run_rows(s, r0, r1, columns).reshape(-1) for s in specs}
