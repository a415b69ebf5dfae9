"""numpy's pairwise-summation tree (numpy/_core/src/umath/loops_utils.h), walked once for every compiled pass.

numpy sums n terms by halving them (the first half a multiple of 8) down to leaves of at most 128 terms,
each added in 8 accumulators, and adds the halves back in the same order. A compiled pass that reads an
output in chunks of whole leaves takes each leaf's sum while the leaf is in cache (`leaves` lists them in
order) and rebuilds numpy's total from those sums (`combine`), bit for bit. The metric pass
(metrics/numba_kernel.py) and the strict pass (verdict/strict/numba_kernel.py) both use these two walks (the strict pass also
for numpy's `add.reduceat` of its groups: `segment_sum`, `segment_walked`); they are
written without recursion because numba's disk cache cannot hold a recursive function. A leaf's 8
accumulators are one vector register (`leaf`, through a loop written in LLVM IR): numba kept
them scalar, at 0.28 ns per element and sum on an AMD EPYC against 0.10 ns, and each lane still adds its
terms in numpy's order, so the sums are the same bit for bit.

Imported by those passes only, on the first check, never at collection.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ..compiled import compiled

PW_BLOCK = 128  # numpy's pairwise summation: leaves of up to 128 elements, 8 accumulators each


def value(x: Any) -> Any:
    """An element's value in a compiled pass: a 16-bit output's storage element (metrics/storage.py) widened
    to float32, exactly, without a branch (so that the loops stay vector code): bf16 storage (uint16) is
    `bits << 16`; fp16 storage (int16) is its exponent and mantissa moved into a float32's (`<< 13`) and scaled
    by 2**112 (the bias 127 - 15; a subnormal fp16 lands on a float32 subnormal, which the multiply keeps: no
    flush to zero under these flags), its exponent 31 made float32's 255 (inf, NaN with its payload) and its
    sign put back. A float as it is."""
    raise NotImplementedError("compiled passes only")


_HALF_SCALE = np.float32(2.0 ** 112)


@overload(value, jit_options={"nogil": True, "error_model": "numpy"})
def _value(x: Any) -> Any:
    if x == types.uint16:
        def bf16(x: Any) -> Any:
            return np.uint32(np.uint32(x) << np.uint32(16)).view(np.float32)

        return bf16
    if x == types.int16:
        def fp16(x: Any) -> Any:
            h = np.uint32(np.uint16(x))
            body = np.uint32((h & np.uint32(0x7FFF)) << np.uint32(13))
            scaled = np.float32(body.view(np.float32) * _HALF_SCALE).view(np.uint32)
            top = np.uint32(0x7F800000) if (h & np.uint32(0x7C00)) == np.uint32(0x7C00) else np.uint32(0)
            return np.uint32(scaled | top | ((h & np.uint32(0x8000)) << np.uint32(16))).view(np.float32)

        return fp16

    def same(x: Any) -> Any:
        return x

    return same


def in_dtype_of(a: Any, lo: int, n: int, row: Any) -> Any:
    """a[lo:lo + n] in the dtype of `row` (compiled passes only): the slice itself where a is of that dtype, else
    its values rounded to it (numpy's cast: a float64 bench to float32) in row[:n]."""
    raise NotImplementedError("compiled passes only")


@overload(in_dtype_of, jit_options={"nogil": True, "error_model": "numpy"})
def _in_dtype_of(a: Any, lo: int, n: int, row: Any) -> Any:
    def itself(a: Any, lo: int, n: int, row: Any) -> Any:
        return a[lo:lo + n]

    def rounded(a: Any, lo: int, n: int, row: Any) -> Any:
        s = a[lo:lo + n]  # a loop over a slice compiles to vector code (a[lo + j], with its index check, does not)
        for j in range(n):
            row[j] = s[j]
        return row[:n]

    return itself if a.dtype == row.dtype else rounded


def half_rounded(x: Any) -> Any:
    """A float32 or float64 rounded to fp16 (to nearest, ties to even; subnormals, inf beyond 65,504, NaN kept),
    in its own type, exactly numpy's x.astype(float16).astype(x.dtype), without a branch (compiled passes only):
    fp16's normal range rounds away the lowest 13 (float32) or 42 (float64) mantissa bits, as bf16's rounding
    does 16, and its subnormals (|x| < 2**-14, multiples of 2**-24) are rounded by the type's own addition where
    its spacing is 2**-24: in [0.5, 1) for float32, in [2**28, 2**29) for float64. A float64 is rounded from
    itself, as numpy's cast does, never through float32 (which could round twice)."""
    raise NotImplementedError("compiled passes only")


def _half_rounder(ftype: Any, utype: Any) -> Any:
    """half_rounded for one float type (`utype`: the unsigned integer of its width), with the type's constants."""
    mant = np.finfo(ftype).nmant  # 23 or 52 mantissa bits, of which fp16 keeps 10
    one, dropped = utype(1), utype(mant - 10)
    sign = one << utype(8 * np.dtype(utype).itemsize - 1)
    body, bias, keep = ~sign, (one << (dropped - one)) - one, ~((one << dropped) - one)
    inf, top = ftype(np.inf).view(utype), ftype(2.0 ** 16).view(utype)  # 65,520 and beyond round to 2**16: inf
    magic, tiny = ftype(2.0 ** (mant - 24)), ftype(2.0 ** -14)  # the type's spacing is 2**-24 above `magic`

    def rounded(x: Any) -> Any:
        bits = ftype(x).view(utype)
        a_bits = utype(bits & body)
        a = a_bits.view(ftype)
        normal = utype((a_bits + bias + ((a_bits >> dropped) & one)) & keep)
        normal = inf if normal >= top else normal
        sub = ftype(ftype(a + magic) - magic).view(utype)
        r = utype(sub if a < tiny else normal)
        r = utype(a_bits if a != a else r)  # NaN
        return utype(r | (bits & sign)).view(ftype)

    return rounded


_HALF_ROUNDERS = {types.float32: _half_rounder(np.float32, np.uint32), types.float64: _half_rounder(np.float64, np.uint64)}


@overload(half_rounded, jit_options={"nogil": True, "error_model": "numpy"})
def _half_rounded(x: Any) -> Any:
    return _HALF_ROUNDERS[x]


def widened(x: Any, like: Any) -> Any:
    """x in the float type of `like` (compiled passes only): a float32 beside a float64 widened, exactly (an fp16
    output's values beside a float64 bench); else x as it is."""
    raise NotImplementedError("compiled passes only")


@overload(widened, jit_options={"nogil": True, "error_model": "numpy"})
def _widened(x: Any, like: Any) -> Any:
    def wide(x: Any, like: Any) -> Any:
        return np.float64(x)

    def same(x: Any, like: Any) -> Any:
        return x

    return wide if like == types.float64 and x == types.float32 else same


def as_int(x: Any) -> Any:
    """A float's bits as the signed integer of its width (maxima keys, compiled passes only)."""
    raise NotImplementedError("compiled passes only")


@overload(as_int, jit_options={"nogil": True, "error_model": "numpy"})
def _as_int(x: Any) -> Any:
    def narrow(x: Any) -> Any:
        return np.float32(x).view(np.int32)

    def wide(x: Any) -> Any:
        return np.float64(x).view(np.int64)

    return narrow if x == types.float32 else wide


@compiled
def max_leaves(n: int) -> int:
    """An upper bound on the leaves of n terms (every leaf but a short whole sum holds more than 32)."""
    return n // 32 + 2


@compiled
def leaves(n: int, los: Any, lens: Any, stack: Any) -> int:
    """The leaves of numpy's pairwise sum of n terms, in order, into los / lens (at least max_leaves(n)
    long); returns their number. `stack`: the caller's int64 array of 3 x 64 (so a call allocates nothing)."""
    start, size, stage = stack[0], stack[1], stack[2]
    start[0], size[0], stage[0] = 0, n, 0
    top, count = 0, 0
    while top >= 0:
        if size[top] <= PW_BLOCK:
            los[count], lens[count] = start[top], size[top]
            count += 1
            top -= 1
            while top >= 0 and stage[top] == 2:  # a right half done: its node is done
                top -= 1
            if top < 0:
                break
            stage[top] = 2  # a left half done: on to the right half
            half = size[top] // 2
            half -= half % 8
            start[top + 1], size[top + 1], stage[top + 1] = start[top] + half, size[top] - half, 0
        else:
            half = size[top] // 2
            half -= half % 8
            stage[top] = 1
            start[top + 1], size[top + 1], stage[top + 1] = start[top], half, 0
        top += 1
    return count


@compiled
def chunk_last(los: Any, lens: Any, first: int, count: int, limit: int) -> int:
    """The last of the leaves first, first + 1, ... that together span at most `limit` elements (at least
    leaf `first`): both compiled passes read an output in such chunks of whole leaves, kept in cache."""
    last, lo = first, los[first]
    while last + 1 < count and los[last + 1] + lens[last + 1] - lo <= limit:
        last += 1
    return last


@compiled
def combine(n: int, sums: Any, stack: Any, left: Any) -> Any:
    """numpy's pairwise sum of n terms from its leaves' sums (in `leaves`' order): the same tree, added
    back in the same order, in the dtype of `left` (64 elements; `stack` as for `leaves`)."""
    size, stage = stack[0], stack[1]
    size[0], stage[0] = n, 0
    top, leaf = 0, 0
    while True:
        if size[top] <= PW_BLOCK:
            value = sums[leaf]
            leaf += 1
            top -= 1
            while top >= 0 and stage[top] == 2:
                value = left[top] + value
                top -= 1
            if top < 0:
                return value
            left[top], stage[top] = value, 2
            half = size[top] // 2
            half -= half % 8
            size[top + 1], stage[top + 1] = size[top] - half, 0
        else:
            half = size[top] // 2
            half -= half % 8
            stage[top] = 1
            size[top + 1], stage[top + 1] = half, 0
        top += 1


def _tuple(context: Any, builder: Any, vec: Any, ret: Any) -> Any:
    """A numba UniTuple from an LLVM vector (LLVM folds the pair of conversions away)."""
    out = cgutils.get_null_value(context.get_value_type(ret))  # type: ignore[no-untyped-call]
    for k in range(ret.count):
        out = builder.insert_value(out, builder.extract_element(vec, ir.Constant(ir.IntType(32), k)), k)
    return out


def _lanes_typed(typingctx: Any, arr: Any, vectors: Any, start: Any) -> Any:
    """The 8 accumulators of numpy's leaf over arr[:8 * vectors]: lane k adds arr[k], arr[8 + k], ... in order,
    in float64 where `start` is a float64 (its terms widened), else in arr's dtype, as one vector register in one
    loop written in LLVM IR (numba keeps neither 8 scalar accumulators nor a tuple of them in a vector register)."""
    wide = start == types.float64
    ret = types.UniTuple(types.float64 if wide else arr.dtype, 8)  # type: ignore[no-untyped-call]

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        dtype = signature.args[0].dtype
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        vector = ir.VectorType(context.get_value_type(dtype), 8)
        lane = ir.VectorType(ir.DoubleType(), 8) if wide else vector

        def load(index: Any) -> Any:
            value = builder.load(builder.bitcast(builder.gep(data, [index]), vector.as_pointer()),
                                 align=dtype.bitwidth // 8)
            return builder.fpext(value, lane) if wide and dtype != types.float64 else value

        eight = ir.Constant(args[1].type, 8)
        total = cgutils.alloca_once_value(builder, load(ir.Constant(args[1].type, 0)))  # type: ignore[no-untyped-call]
        with cgutils.for_range(builder, builder.sub(args[1], ir.Constant(args[1].type, 1))) as loop:
            index = builder.mul(builder.add(loop.index, ir.Constant(args[1].type, 1)), eight)
            builder.store(builder.fadd(builder.load(total), load(index)), total)
        return _tuple(context, builder, builder.load(total), ret)

    return ret(arr, vectors, start), codegen


_lanes: Any = intrinsic(_lanes_typed)  # called as _lanes(arr, vectors, start) in compiled code


@compiled
def leaf(a: Any, lo: int, n: int, start: Any) -> Any:
    """numpy's pairwise leaf of a[lo:lo + n] (n <= 128) in the dtype of `start`: a's own (numpy 2's -0.0 in
    it), or float64 for a float32 sum into float64 (numpy's cast buffers hold the terms widened). In order below
    8 terms (from `start`), else in 8 accumulators (one vector), added pairwise, then the rest in order."""
    s = a[lo:lo + n]
    if n < 8:
        res = start
        for i in range(n):
            res += s[i]
        return res
    whole = n - (n % 8)
    r = _lanes(s, whole // 8, start)
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(whole, n):
        res += s[i]
    return res


class Tree(NamedTuple):
    """A walk's buffers, made once per call: the leaves (start, length) and their sums, the walk's stack."""
    los: Any
    lens: Any
    sums: Any
    stack: Any
    left: Any


@compiled
def tree_for(n: int) -> Tree:
    """The buffers of walks of up to n terms."""
    k = max_leaves(n)
    return Tree(np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k), np.empty((3, 64), np.int64), np.empty(64))


@compiled
def pairwise(a: Any, lo: int, n: int, zero: Any, tree: Any) -> Any:
    """numpy's pairwise sum of a[lo:lo + n] in float64 (`zero` starts its short leaves): the leaves of
    the tree above, added back by its walk. `tree`: the caller's Tree (so that a call allocates
    nothing)."""
    if n <= PW_BLOCK:
        return leaf(a, lo, n, zero)
    count = leaves(n, tree.los, tree.lens, tree.stack)
    for i in range(count):
        tree.sums[i] = leaf(a, lo + tree.los[i], tree.lens[i], zero)
    return combine(n, tree.sums[:count], tree.stack, tree.left)


@compiled
def segment_sum(a: Any, lo: int, n: int, start: float, tree: Tree) -> Any:
    """One segment of `add.reduceat`: its first term, then the pairwise sum of the others, whose short
    leaves start from `start` (-0.0 in numpy 2, which keeps the sign of a sum of negative zeros)."""
    return a[lo] + pairwise(a, lo + 1, n - 1, start, tree) if n > 1 else a[lo]


@compiled
def segment_walked(a: Any, lo: int, n: int, start: float, count: int, tree: Tree) -> Any:
    """segment_sum with the leaves of its n - 1 pairwise terms already in tree.los / tree.lens (`count` of
    them): the bias test's four sums of each group of one size walk the tree once."""
    if n == 1:
        return a[lo]
    if n - 1 <= PW_BLOCK:
        return a[lo] + leaf(a, lo + 1, n - 1, start)
    for i in range(count):
        tree.sums[i] = leaf(a, lo + 1 + tree.los[i], tree.lens[i], start)
    return a[lo] + combine(n - 1, tree.sums[:count], tree.stack, tree.left)
