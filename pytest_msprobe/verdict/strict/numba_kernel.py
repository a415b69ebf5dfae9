"""The strict checks' pass over one output, compiled (numba): every statistic in one read of the arrays.

The numpy backend (numpy_pass.py) makes some 30 numpy passes over each block; this kernel reads bench, device
and torch run once, a chunk of whole leaves of numpy's pairwise-summation tree at a time (the tree walk of
metrics/pairwise.py, shared with msprobe's metric pass), computes each element's errors in one loop and takes
the leaves' sums while the chunk is in the first cache level (the magnitude run, the product and a
reduction's row statistics are read a block at a time, before its chunks). It repeats numpy's arithmetic operation by operation, in the same work dtype
(float32 for 16-bit outputs, float64 else) and with numpy's own summation order (pairwise, as
`ndarray.sum` and `add.reduceat` add), so its totals are bitwise those of the numpy version that
the tests hold it to (numpy_pass.py). The element arithmetic of the device dtype's grid (rounding,
ULPs, flushing) is verdict/grid_kernel.py's.

Imported on the first check, never at collection: importing numba and loading the compiled code from
its on-disk cache (`cache=True`) costs a fraction of a second once per process.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...compiled import compiled
from ...metrics.pairwise import (
    PW_BLOCK,
    Tree,
    chunk_last,
    combine,
    half_rounded,
    leaf,
    leaves,
    segment_sum,
    segment_walked,
    tree_for,
    value,
)
from ..grid_kernel import bf16_rounded, nan_max, prepare_16, round_into, ulp_into, unflush_into, unflushed
from .rules import KINDS as KIND_NAMES
from .rules import P_ACC, P_EMIN, P_EST, P_FLOOR, P_GROSS, P_LEAF, P_ROW, P_TORCH, P_ULP, P_WINDOW

_CAST_BUFFER = 8192  # numpy's buffer: a sum with a cast (float32 terms, float64 total) adds buffer by buffer
# where numpy's short pairwise leaves start: -0.0 from numpy 2 on (a sum of negative zeros is -0.0), else 0.0
LEAF_START = float(np.add.reduceat(np.array([-0.0, -0.0]), [0])[0])

# codes of the device dtypes (grid.FORMATS) and of the op kinds (rules.KINDS, in their order)
FORMATS = {"torch.bfloat16": 0, "torch.float16": 1, "torch.float32": 2, "torch.float64": 3}
KINDS = {kind: code for code, kind in enumerate(KIND_NAMES)}
EXACT, REDUCTION, CONTRACTION = KINDS["exact"], KINDS["reduction"], KINDS["contraction"]
# slots of the results (`out`); the float parameters (`params`) are in rules' P_* order
SCRATCH, WIDE = 16, 1  # rows of the block buffers in the work dtype and in float64
(O_SUM_W, O_SUM_T, O_MAX_T, O_MAX_W, O_WORST, O_GROSS, O_WRONG, O_FIRST_WRONG, O_WRONG_ZERO, O_WRONG_UP,
 O_OFF_TIE, O_GROUPS) = range(12)


@compiled
def _load(src: Any, dst: Any, n: int) -> None:
    """dst[:n] = the values of src[:n] (a bf16 output's storage widened), cast to dst's dtype (a loop over a
    slice compiles to vector code; numba's slice assignment, and src[start + j] with its negative-index check,
    do not)."""
    for j in range(n):
        dst[j] = value(src[j])


@compiled
def _top(w: Any, n: int, ints: Any) -> tuple[int, Any]:
    """(how many NaNs, the largest bits) of the non-negative values (or NaN) w[:n]: the bits order
    non-negative floats as their values do, and an integer maximum compiles to vector code."""
    bits = w.view(ints.dtype)  # `ints`: an empty integer array of w's width
    top = bits[0] * 0
    nans = 0
    for j in range(n):
        v = bits[j]
        nans += 1 if w[j] != w[j] else 0
        top = v if v > top else top
    return nans, top


@compiled
def _first(w: Any, n: int, top: Any, ints: Any) -> int:
    """The first j with w[j]'s bits equal to `top`."""
    bits = w.view(ints.dtype)
    for j in range(n):
        if bits[j] == top:
            return j
    return 0


@compiled
def _clip1(x: Any, one: Any) -> Any:
    """np.clip(x, -1, 1) (NaN stays NaN)."""
    if x != x:
        return x
    return -one if x < -one else (one if x > one else x)


@compiled
def _errors_t(bw: Any, d: Any, t: Any, rw: Any, uw: Any, sx: Any, n: int, f1: Any, f2: Any, c: Any) -> tuple[int, int]:
    """The chunk's normalised errors of device (f1) and torch run (f2), in one loop (it writes only those two,
    so that it compiles to vector code): the scale is the rounded bench's ULP, at least twice the torch run's
    error and `sx`'s terms; returns the count above `gross` and the count of wrongly rounded elements (neither
    the correctly rounded result nor torch's: _exact looks closer at a chunk that has some). A compiled kernel: its arrays and constants come as arguments."""
    zero, one, tiny, c_torch, c_gross = c[C_ZERO], c[C_ONE], c[P_EMIN], c[P_TORCH], c[P_GROSS]
    over = wrong = 0
    for j in range(n):
        bj, r = bw[j], rw[j]
        dj = unflushed(value(d[j]), bj, r, tiny, zero)
        tj = unflushed(value(t[j]), bj, r, tiny, zero)
        wrong += 1 if (dj != r) & (dj != tj) else 0
        et = abs(tj - bj)
        s = nan_max(nan_max(uw[j], c_torch * et), sx[j])
        w = abs(dj - bj) / s
        w = w * (one if dj != r else zero)
        f1[j] = w
        f2[j] = et / s * (one if tj != r else zero)
        over += 1 if w > c_gross else 0
    return over, wrong


@compiled
def _settled(bw: Any, d: Any, t: Any, rw: Any, sx: Any, n: int, c: Any) -> bool:
    """Whether every element of the chunk is settled (_holds, and the scale is a number): then _errors_t would
    write +0.0 throughout (a finite error over a positive scale, times zero), so the chunk's sums, maxima and
    counts are known without it: most chunks of a correct kernel's output, since exact ops round correctly. A compiled kernel: its arrays and constants come as arguments."""
    zero, tiny = c[C_ZERO], c[P_EMIN]
    has_t, held = t.size > 0, 0
    for j in range(n):
        held += _holds(d, t, j, bw[j], rw[j], has_t, tiny, zero) & (sx[j] == sx[j])
    return held == n


@compiled
def _holds(d: Any, t: Any, j: int, bj: Any, r: Any, has_t: bool, tiny: Any, zero: Any) -> Any:
    """Whether device and torch run (where there is one) hold the finite, correctly rounded bench `r` at element j
    (a flushed subnormal result counts as `r`): the element check of _settled and _settled_16. A compiled kernel: its arrays and constants come as arguments."""
    dj = unflushed(value(d[j]), bj, r, tiny, zero)
    tj = unflushed(value(t[j]), bj, r, tiny, zero) if has_t else r
    return (dj == r) & (tj == r) & (abs(r) < np.inf)


@compiled
def _settled_16(b: Any, d: Any, t: Any, sx: Any, n: int, c: Any, fmt: int) -> bool:
    """_settled of a 16-bit chunk straight from the bench, rounded in registers, so that a settled chunk never writes
    _prepare_16's rows (`sx`: the scale terms, or empty where the scale is the ULP, finite where the bench is). A compiled kernel: its arrays and constants come as arguments."""
    zero, tiny = c[C_ZERO], c[P_EMIN]
    has_t, has_x, held = t.size > 0, sx.size > 0, 0
    for j in range(n):
        v = np.float32(b[j])
        r = bf16_rounded(v) if fmt == 0 else half_rounded(v)
        held += _holds(d, t, j, v, r, has_t, tiny, zero) & ((sx[j] == sx[j]) if has_x else True)
    return held == n


@compiled
def _errors(bw: Any, d: Any, rw: Any, uw: Any, sx: Any, n: int, f1: Any, c: Any) -> tuple[int, int]:
    """_errors_t without a torch run: the correctly rounded bench stands in for it. A compiled kernel: its arrays and constants come as arguments."""
    zero, one, tiny, c_gross = c[C_ZERO], c[C_ONE], c[P_EMIN], c[P_GROSS]
    over = wrong = 0
    for j in range(n):
        bj, r = bw[j], rw[j]
        dj = unflushed(value(d[j]), bj, r, tiny, zero)
        w = abs(dj - bj) / nan_max(uw[j], sx[j])
        w = w * (one if dj != r else zero)
        f1[j] = w
        over += 1 if w > c_gross else 0
        wrong += 1 if dj != r else 0
    return over, wrong


@compiled
def _extras(b: Any, t: Any, mag: Any, prod: Any, est: Any, start: int, nb: int, size: int, fmt: int, rowk: bool,
            sx: Any, bw: Any, rw: Any, tw: Any, pu: Any, squares: Any, c: Any, params: Any, tree: Tree) -> None:
    """The block's scale terms beyond the ULP and the torch run's own error, into rows[0] (`sx`): the floor,
    the RMS of the torch run's errors over each group (reductions, contractions with a torch run; more where
    the torch run was estimated), the magnitude run's accumulation error, the product's ULP; bw, rw, tw, pu
    are rows for the block's values. A compiled kernel: its arrays and constants come as arguments."""
    zero, tiny, step, c_floor, c_acc = c[C_ZERO], c[P_EMIN], c[P_ULP], c[P_FLOOR], c[P_ACC]
    for j in range(nb):
        sx[j] = zero
    if c_floor != zero:
        for j in range(nb):
            sx[j] = nan_max(sx[j], c_floor)
    if rowk:
        _load(b[start:start + nb], bw, nb)
        round_into(bw, rw, nb, fmt)
        _load(t[start:start + nb], tw, nb)
        unflush_into(tw, bw, rw, nb, tiny, zero)
        for j in range(nb):
            et = abs(tw[j] - bw[j])
            squares[j] = np.float64(et) * np.float64(et)
        for g0 in range(0, nb, size):
            cnt = min(size, nb - g0)
            rms = math.sqrt(segment_sum(squares, g0, cnt, params[P_LEAF], tree) / cnt)
            c[C_TMP] = params[P_ROW] * rms  # rounded to the work dtype, as numpy's operand is
            r_row = c[C_TMP]
            for j in range(g0, g0 + cnt):
                sx[j] = nan_max(sx[j], r_row)
            if est.size:
                c[C_TMP] = params[P_EST] * rms
                r_est = c[C_TMP]
                flags = est[start + g0:start + g0 + cnt]
                for j in range(cnt):
                    if flags[j]:
                        sx[g0 + j] = nan_max(sx[g0 + j], r_est)
    if mag.size:
        _load(mag[start:start + nb], bw, nb)
        for j in range(nb):
            sx[j] = nan_max(sx[j], c_acc * abs(bw[j]))
    if prod.size:
        _load(prod[start:start + nb], bw, nb)
        ulp_into(bw, pu, nb, tiny, step)
        for j in range(nb):
            sx[j] = nan_max(sx[j], pu[j])


@compiled
def _bias_terms(bw: Any, d: Any, t: Any, rw: Any, uw: Any, n: int, sd: Any, st: Any, sdz: Any, stz: Any,
                c: Any) -> None:
    """The signed errors (ULPs from the correctly rounded result, clipped to +-1) of device and torch run (the
    rounded bench where there is none: `t` empty), and both times -sign(bench), into sd, st, sdz, stz. A compiled kernel: its arrays and constants come as arguments."""
    zero, one, tiny = c[C_ZERO], c[C_ONE], c[P_EMIN]
    has_t = t.size > 0
    for j in range(n):
        x, r = bw[j], rw[j]
        dj = unflushed(value(d[j]), x, r, tiny, zero)
        tj = unflushed(value(t[j]), x, r, tiny, zero) if has_t else r
        tz = -(one if x > zero else (-one if x < zero else (zero if x == zero else x)))
        a = _clip1((dj - r) / uw[j], one)  # from the correctly rounded result, which has no error
        e = _clip1((tj - r) / uw[j], one)
        sd[j], st[j], sdz[j], stz[j] = a, e, a * tz, e * tz


@compiled
def _exact(bw: Any, d: Any, t: Any, rw: Any, uw: Any, n: int, c: Any, counts: Any) -> int:
    """Wrongly rounded elements of the chunk (neither the correctly rounded result nor torch's, where there is
    a torch run) into counts (wrong, toward zero, upward, off a tie); returns the first one's index, or -1. A compiled kernel: its arrays and constants come as arguments."""
    zero, tiny, c_half, c_window = c[C_ZERO], c[P_EMIN], c[C_HALF], c[P_WINDOW]
    has_t = t.size > 0
    n_wrong = n_zero = n_up = n_off = 0
    for j in range(n):
        x, r = bw[j], rw[j]
        dj = unflushed(value(d[j]), x, r, tiny, zero)
        tj = unflushed(value(t[j]), x, r, tiny, zero) if has_t else r
        bad = (dj != r) & (dj != tj)
        n_wrong += 1 if bad else 0
        n_zero += 1 if bad and abs(dj) < abs(r) else 0
        n_up += 1 if bad and dj > r else 0
        n_off += 1 if bad and abs(abs(x - r) / uw[j] - c_half) > c_window else 0
    counts[0] += n_wrong
    counts[1] += n_zero
    counts[2] += n_up
    counts[3] += n_off
    if n_wrong:
        for j in range(n):
            x, r = bw[j], rw[j]
            dj = unflushed(value(d[j]), x, r, tiny, zero)
            tj = unflushed(value(t[j]), x, r, tiny, zero) if has_t else r
            if (dj != r) & (dj != tj):
                return j
    return -1


CHUNK = 2048  # elements per chunk of whole pairwise leaves: the chunk's rows stay in the first cache level
# extra slots of the work-dtype constants (`c`): after the parameters
C_ZERO, C_ONE, C_HALF, C_TMP = 10, 11, 12, 13
# a block's results: float64 (`rows`: its sums, and its largest errors, NaN where it holds a NaN) and integers
R_SUM_W, R_SUM_T, R_MAX_W, R_MAX_T = range(4)
I_WORST, I_GROSS, I_WRONG, I_WRONG_ZERO, I_WRONG_UP, I_OFF_TIE, I_FIRST_WRONG, I_GROUPS = range(8)


@compiled
def strict_blocks(b: Any, d: Any, t: Any, mag: Any, prod: Any, est: Any, scratch: Any, wide: Any, ints: Any,
                  fmt: int, kind: int, size: int, block: int, every: int, params: Any, b0: int, b1: int,
                  origin: int, bias: Any, counts: Any, rows: Any, irows: Any) -> None:
    """Blocks b0..b1 of `block` elements (groups of `size`) of the strict pass, each into its own row of `rows`
    and `irows` (R_*, I_*) and, every `every`-th block, the bias test's group sums into bias[0..3] and their sizes
    into `counts` at the block's own groups: either thread may take any blocks (helper.share), and strict_finish
    adds them in order. `t`, `mag`, `prod`, `est` of length 0 are absent; `b` is float32 or float64 (rounded to
    the work dtype here); `scratch` holds SCRATCH rows of at least `block` elements of the work dtype, `wide` WIDE
    rows of float64 (the calling thread's), `ints` is an empty array of the integers of the work width. Each
    block is read in chunks of whole leaves of numpy's pairwise tree of its sums (the 8192-element buffers of a
    float32 sum into float64, or the whole block), each chunk once, in one loop: a compiled kernel, kept whole. The
    arrays hold the output's elements from `origin` on (0: the whole output; streamed.py: a piece of it)."""
    m = d.size + origin
    has_t = t.size > 0
    rowk = has_t and (kind == REDUCTION or kind == CONTRACTION)
    wd = scratch.dtype
    c = np.empty(C_TMP + 1, wd)  # the parameters rounded to the work dtype, as numpy's operands are
    for k in range(len(params)):
        c[k] = params[k]
    c[C_ZERO], c[C_ONE], c[C_HALF] = 0.0, 1.0, 0.5
    tiny, step = c[P_EMIN], c[P_ULP]
    cast = scratch.itemsize == 4  # float32 terms summed in float64: numpy's buffered sum
    piece_max = _CAST_BUFFER if cast else block
    leaf_zero = 0.0 if cast else params[P_LEAF]
    bw, rw, uw, f1, f2 = scratch[0], scratch[1], scratch[2], scratch[3], scratch[4]
    sx = scratch[7]  # the block's scale terms beyond the ULP and the torch run's own error
    sd, st, sdz, stz = scratch[8], scratch[9], scratch[10], scratch[11]  # the block's signed errors
    has_x = params[P_FLOOR] != 0.0 or rowk or mag.size > 0 or prod.size > 0
    settle = abs(c[P_TORCH]) < np.inf  # a torch run's error times a finite factor is a number (0 * inf is not)
    tree, seg = tree_for(max(block, piece_max)), tree_for(block)  # the block's walk, the segment sums'
    los, lens, sums, stack, left = tree
    leaf_t = np.empty(len(sums))
    key = np.empty(1, ints.dtype)
    value = key.view(wd)  # a maximum's bits back to its value
    wrong = np.zeros(4, np.int64)
    per_block = -(-block // size)  # groups of a whole block
    for bi in range(b0, b1):
        start = bi * block
        at = start - origin  # the block's first element in the arrays
        nb = min(block, m - start)
        sampled = bi % every == 0
        if has_x:
            _extras(b, t, mag, prod, est, at, nb, size, fmt, rowk, sx, scratch[12], scratch[13], scratch[14],
                    scratch[15], wide[0], c, params, seg)
        block_w = block_t = 0.0
        nan_w = nan_t = False
        top_w = top_t = key[0] * 0 - 1
        at_w, gross, first_wrong = 0, 0, -1
        wrong[:] = 0
        for p0 in range(0, nb, piece_max):  # numpy's buffers of a cast sum, or the whole block
            pn = min(piece_max, nb - p0)
            count = leaves(pn, los, lens, stack)
            first = 0
            while first < count:  # chunks of whole leaves
                last, c0 = chunk_last(los, lens, first, count, CHUNK), los[first]
                cn = los[last] + lens[last] - c0
                off = p0 + c0
                lo = at + off
                scale = sx[off:off + cn] if has_x else uw
                bad = 0
                quick = settle and not sampled and fmt <= 1 and cast  # (the bias terms need the rows)
                settled = quick and _settled_16(b[lo:lo + cn], d[lo:lo + cn], t[lo:lo + cn],
                                                scale if has_x else sx[:0], cn, c, fmt)
                if not settled:
                    if fmt <= 1 and cast:
                        prepare_16(b[lo:lo + cn], bw, rw, uw, cn, tiny, step, fmt)
                    else:
                        _load(b[lo:lo + cn], bw, cn)
                        round_into(bw, rw, cn, fmt)
                        ulp_into(rw, uw, cn, tiny, step)
                    settled = not quick and settle and _settled(bw, d[lo:lo + cn], t[lo:lo + cn], rw, scale, cn, c)
                if settled:
                    # both rows of normalised errors would be +0.0: leaves summing to 0.0, maxima 0 at the
                    # chunk's first element, nothing wrongly rounded, gross only under a negative threshold
                    gross += cn if c[C_ZERO] > c[P_GROSS] else 0
                    for i in range(first, last + 1):
                        sums[i] = leaf_t[i] = 0.0
                    if top_w < 0:
                        top_w, at_w = top_w * 0, off
                    top_t = top_t * 0 if top_t < 0 else top_t
                else:
                    if has_t:
                        over, bad = _errors_t(bw, d[lo:lo + cn], t[lo:lo + cn], rw, uw, scale, cn, f1, f2, c)
                    else:
                        over, bad = _errors(bw, d[lo:lo + cn], rw, uw, scale, cn, f1, c)
                    gross += over
                    for i in range(first, last + 1):
                        sums[i] = leaf(f1, los[i] - c0, lens[i], leaf_zero)
                        if has_t:
                            leaf_t[i] = leaf(f2, los[i] - c0, lens[i], leaf_zero)
                    # np.argmax of the block: its first NaN, else its first largest
                    nans, top = _top(f1, cn, ints)
                    if nans:
                        nan_w = True
                    elif top > top_w:
                        top_w, at_w = top, off + _first(f1, cn, top, ints)
                    if has_t:
                        nans, top = _top(f2, cn, ints)
                        nan_t = nan_t or nans > 0
                        top_t = top if top > top_t else top_t
                if kind == EXACT and bad:
                    j = _exact(bw, d[lo:lo + cn], t[lo:lo + cn], rw, uw, cn, c, wrong)
                    if j >= 0 and first_wrong < 0:
                        first_wrong = start + off + j
                if sampled:
                    _bias_terms(bw, d[lo:lo + cn], t[lo:lo + cn], rw, uw, cn, sd[off:off + cn], st[off:off + cn],
                                sdz[off:off + cn], stz[off:off + cn], c)
                first = last + 1
            block_w += combine(pn, sums[:count], stack, left)
            if has_t:
                block_t += combine(pn, leaf_t[:count], stack, left)
        row, irow = rows[bi], irows[bi]
        row[R_SUM_W], row[R_SUM_T] = block_w, block_t
        key[0] = top_w  # a block holding a NaN leaves the maximum (numpy's argmax finds it): NaN never wins
        row[R_MAX_W] = np.nan if nan_w else value[0]
        key[0] = top_t  # Python's max(max_t, w_t.max()): a NaN maximum leaves it
        row[R_MAX_T] = np.nan if nan_t else value[0]
        irow[I_WORST], irow[I_GROSS], irow[I_FIRST_WRONG], irow[I_GROUPS] = start + at_w, gross, first_wrong, 0
        irow[I_WRONG], irow[I_WRONG_ZERO], irow[I_WRONG_UP], irow[I_OFF_TIE] = wrong[0], wrong[1], wrong[2], wrong[3]
        if sampled:
            groups = bi // every * per_block  # every sampled block but the last is whole
            walked = -1  # the group size whose tree seg holds
            for g0 in range(0, nb, size):
                cnt = min(size, nb - g0)
                if cnt != walked and cnt - 1 > PW_BLOCK:
                    count, walked = leaves(cnt - 1, seg.los, seg.lens, seg.stack), cnt
                bias[0, groups] = segment_walked(sd, g0, cnt, params[P_LEAF], count, seg)
                bias[1, groups] = segment_walked(st, g0, cnt, params[P_LEAF], count, seg)
                bias[2, groups] = segment_walked(sdz, g0, cnt, params[P_LEAF], count, seg)
                bias[3, groups] = segment_walked(stz, g0, cnt, params[P_LEAF], count, seg)
                counts[groups] = cnt
                groups += 1
                irow[I_GROUPS] += 1


@compiled
def strict_finish(rows: Any, irows: Any, has_t: bool, out: Any) -> None:
    """The totals of rules.Totals into `out` (O_*) from every block's results (strict_blocks), taken in the
    blocks' order: the same bits as one pass over the blocks in order."""
    sum_w = sum_t = max_t = 0.0
    max_w, worst, first_wrong = -1.0, 0, -1
    counted = np.zeros(I_GROUPS + 1, np.int64)  # the blocks' counts added (their positions are not read)
    for bi in range(len(rows)):
        row, irow = rows[bi], irows[bi]
        sum_w += row[R_SUM_W]
        sum_t += row[R_SUM_T]
        if row[R_MAX_W] > max_w:
            max_w, worst = row[R_MAX_W], irow[I_WORST]
        if has_t and row[R_MAX_T] > max_t:
            max_t = row[R_MAX_T]
        first_wrong = irow[I_FIRST_WRONG] if first_wrong < 0 else first_wrong
        counted += irow
    out[O_SUM_W], out[O_SUM_T], out[O_MAX_T], out[O_MAX_W] = sum_w, sum_t, max_t, max_w
    out[O_WORST], out[O_GROSS], out[O_WRONG], out[O_FIRST_WRONG] = worst, counted[I_GROSS], counted[I_WRONG], first_wrong
    out[O_WRONG_ZERO], out[O_WRONG_UP] = counted[I_WRONG_ZERO], counted[I_WRONG_UP]
    out[O_OFF_TIE], out[O_GROUPS] = counted[I_OFF_TIE], counted[I_GROUPS]
