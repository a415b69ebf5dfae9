"""msprobe's metric statistics of one output in one compiled pass (numba): metrics/stats.py defines them, fused.py
drives the pass.

The pass walks numpy's pairwise-summation tree of the output (leaves of at most 128 elements, in order),
so each leaf's elements are read once from bench and device and every statistic of the leaf is taken while
they are in cache; the two sums that numpy takes as a pairwise `mean` over the whole output (the RMSE's
squares, the ULP errors) come out bitwise numpy's. Each element is computed by numpy's operations in
numpy's dtypes (metrics/vectorised.py, which stays the oracle): `b` is the bench in its own dtype (the
error dtype), `d` the device values in it too (exactly: fused.compute widens float32 beside float64), or a
bf16 or fp16 output's 16-bit storage beside a float32 bench, each element widened in registers (pairwise.value;
an fp16 output's bench_dev, the bench rounded to fp16, is rounded in registers too: pairwise.half_rounded).

Imported on the first check, never at collection; the compiled code is cached on disk (`cache=True`).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from ..compiled import compiled
from .pairwise import (
    as_int,
    chunk_last,
    combine,
    half_rounded,
    in_dtype_of,
    leaf,
    leaves,
    max_leaves,
    value,
    widened,
)

# float parameters (`params`, rounded to the bench dtype as numpy's weak Python scalars are)
P_EPS, P_SMALL, P_ATOL, P_RTOL, P_T100, P_T1000, P_T10000, P_ULP_THR, P_LEAF = range(9)
# float results (`out`, float64 holding values of the bench dtype where they are msprobe's)
(F_MAX_AE, F_BENCH_ABSMAX, F_DEV_MAX, F_DEV_MIN, F_DOT_DB, F_DOT_DD, F_DOT_BB, F_MAX_REL, F_SUM_REL, F_SUM_SQ,
 F_MAX_ULP, F_SUM_ULP, F_PW_REL) = range(13)
# integer results (`iout`)
(I_WORST, I_LT100, I_LT1000, I_LT10000, I_SMALL, I_SMALL_OVER, I_NORMAL, I_NORMAL_OVER, I_UP, I_DOWN,
 I_NONFINITE, I_DIFFER, I_ULP_OVER) = range(13)
# how the bench becomes msprobe's `bench_dev` (the bench in the device's numpy dtype, then d's dtype)
DEV_SAME, DEV_FP16, DEV_FP32 = 0, 1, 2  # DEV_FP16: rounded to fp16 here (pairwise.half_rounded), DEV_FP32: float32(b)


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _float64_sums(dw: Any, bs: Any, rl: Any, n: int, facc: Any) -> None:
    """The chunk's cosine dot products and relative errors' sum in float64, reassociated (vector code): these
    sums are taken in another order than numpy's anyway (stats.py: in any order); metrics_finish adds the chunks'
    in order."""
    db = dd = bb = sr = 0.0
    for j in range(n):
        fd, fb = np.float64(value(dw[j])), np.float64(bs[j])
        db += fd * fb
        dd += fd * fd
        bb += fb * fb
        sr += np.float64(rl[j])
    facc[F_DOT_DB], facc[F_DOT_DD], facc[F_DOT_BB], facc[F_SUM_REL] = db, dd, bb, sr


# the maxima, kept as integer keys of the float bits (integer maxima compile to vector code, float ones
# with numpy's NaN rule do not): a non-negative float's bits order as its value, NaN above inf
M_AE, M_BABS, M_DMAX, M_DMIN, M_REL, M_ULP = range(6)


@compiled
def _top(bits: Any, n: int) -> Any:
    """The largest of bits[:n] (bits of non-negative floats or NaN)."""
    top = bits[0]
    for j in range(1, n):
        top = bits[j] if bits[j] > top else top
    return top


@compiled
def _chunk(b: Any, d: Any, lo: int, n: int, c: Any, dev: int, do_ulp: bool,
           do_binary: bool, log2_fix: Any, top: int, exp2: Any, odd: Any, kmin: int, mb: int, emin: int, buf: Any,
           ibuf: Any,
           ebuf: Any, absmask: int, inf_key: int, keys: Any, facc: Any, cnt: Any) -> None:
    """The statistics of the elements lo..lo + n (whole pairwise leaves) into keys (maxima), facc (float64
    sums) and cnt (counts); their squares, ULP errors and normal relative errors into buf[0], buf[1], buf[2]
    (rows of at least n) for the pairwise sums. Each loop has one kind of job, so that it compiles to
    vector code. A compiled kernel: its arrays and constants come as arguments."""
    eps, small, atol, rtol = c[P_EPS], c[P_SMALL], c[P_ATOL], c[P_RTOL]
    t100, t1000, t10000 = c[P_T100], c[P_T1000], c[P_T10000]
    zero = c[P_EPS] * 0
    sq, ul, rl, ae = buf[0], buf[1], buf[2], buf[3]
    bs = in_dtype_of(b, lo, n, buf[5])  # the bench in B (a float64 one of a bf16 output rounded here)
    ds = d[lo:lo + n]
    lt100 = lt1000 = lt10000 = n_small = small_over = n_normal = normal_over = up = down = nonfinite = 0
    for j in range(n):
        bj, dj = bs[j], value(ds[j])
        # msprobe's bench_dev: the bench in the device's numpy dtype (compared in the error dtype, which
        # holds it exactly): float32 for fp32 outputs of a float64 bench, rounded to fp16 for fp16 ones
        bv = np.float32(bj) if dev == DEV_FP32 else half_rounded(bj) if dev == DEV_FP16 else bj
        e = abs(dj - bj)
        ab = abs(bj)
        rel = e / (ab + eps)
        ae[j] = e
        lt100 += rel < t100
        lt1000 += rel < t1000
        lt10000 += rel < t10000
        fin = (abs(dj) < np.inf) & (abs(bv) < np.inf)
        sm = fin & (ab <= small)
        nm = fin & (ab > small)
        nonfinite += not fin
        n_small += sm
        small_over += sm & (e > atol)
        n_normal += nm
        normal_over += nm & (rel > rtol)
        k = e if nm else zero
        sq[j] = k * k
        rl[j] = rel if nm else zero
        up += dj > bv
        down += dj < bv
    cnt[I_LT100] += lt100
    cnt[I_LT1000] += lt1000
    cnt[I_LT10000] += lt10000
    cnt[I_SMALL] += n_small
    cnt[I_SMALL_OVER] += small_over
    cnt[I_NORMAL] += n_normal
    cnt[I_NORMAL_OVER] += normal_over
    cnt[I_UP] += up
    cnt[I_DOWN] += down
    cnt[I_NONFINITE] += nonfinite
    _float64_sums(ds, bs, rl, n, facc)
    # np.argmax of ae: the first NaN, else the first largest (NaN's bits lie above every number's)
    iae = ibuf[3]
    t = _top(iae, n)
    if t > keys[M_AE] and keys[M_AE] <= inf_key:  # (not once a NaN is found)
            for j in range(n):
                if iae[j] == t or (t > inf_key and iae[j] > inf_key):
                    keys[M_AE], cnt[I_WORST] = iae[j], lo + j
                    break
    keys[M_REL] = max(keys[M_REL], _top(ibuf[2], n))
    # max |b|, max d and min d: the bits of |b|; d's bits made to order as its values (NaN beyond +-inf)
    babs, dmax, dmin = keys[M_BABS], keys[M_DMAX], keys[M_DMIN]
    bb = bs.view(ibuf.dtype)
    for j in range(n):
        v = bb[j] & absmask
        babs = v if v > babs else babs
        x = as_int(widened(value(ds[j]), eps))  # d's value in the bench dtype (eps: of it), as its bits
        kx = x ^ ((x >> (8 * bb.itemsize - 1)) & absmask)
        dmax = kx if kx > dmax else dmax
        dmin = kx if kx < dmin else dmin
    keys[M_BABS], keys[M_DMAX], keys[M_DMIN] = babs, dmax, dmin
    if do_binary:
        differ = 0
        for j in range(n):
            differ += bs[j] != value(ds[j])
        cnt[I_DIFFER] += differ
    if do_ulp:
        _ulps(bs, ds, bb, n, log2_fix, top, exp2, odd, kmin, mb, emin, ul, ibuf[1], buf[4], ibuf[4], ebuf,
              c[P_ULP_THR], keys, cnt)


@compiled
def _ulps(bs: Any, ds: Any, bits: Any, n: int, log2_fix: Any, top: int, exp2: Any, odd: Any, kmin: int, mb: int,
          emin: int, ul: Any, iul: Any, scale: Any, iscale: Any, eb: Any, thr: Any, keys: Any, cnt: Any) -> None:
    """ul[:n] = vectorised.ulp_errors of the leaf (`iul`: ul's bits); their maximum (NaN wins) and count
    above `thr`. The scale 2**(mb - eb) is built from its bits, numpy's own exp2 taken where it is not that
    power of two (`odd`: the indices into `exp2` of those exponents). A compiled kernel: its arrays and constants come as arguments."""
    narrow = bits.itemsize == 4
    width, bias, allexp = (23, 127, 255) if narrow else (52, 1023, 2047)
    first = (np.int64(1) << width) - top
    mask = (np.int64(1) << width) - 1
    near = 0
    for j in range(n):  # max(floor(log2|b|), emin) from the bits; 0 for b == 0 (msprobe's quirk)
        x = np.int64(bits[j])
        biased = (x >> width) & allexp
        mant = x & mask
        e = biased - bias if biased - bias > emin else emin
        e = emin if biased == 0 else e  # subnormal: below every format's smallest normal
        e = (0 if emin < 0 else emin) if (biased == 0) & (mant == 0) else e
        e = mb if biased == allexp else e  # NaN / inf bench: any scale, the error is NaN below
        eb[j] = mb - e - kmin
        kb = mb - e + bias  # the scale's biased exponent: inf beyond the largest
        iscale[j] = (allexp if kb >= allexp else kb) << width
        near += (mant >= first) & (biased != allexp) & (biased != 0) | (kb <= 0)
    if near:  # numpy's log2 rounds up to the next integer just below a power of two; subnormal scales
        for j in range(n):
            x = np.int64(bits[j])
            biased = (x >> width) & allexp
            mant = x & mask
            if mant >= first and biased != allexp and biased != 0:
                eb[j] = mb - max(biased - bias + log2_fix[biased, mant - first], emin) - kmin
                scale[j] = exp2[eb[j]]
            if eb[j] + kmin + bias <= 0:
                scale[j] = exp2[eb[j]]
    for k in odd:
        hits = 0
        for j in range(n):
            hits += eb[j] == k
        if hits:
            for j in range(n):
                if eb[j] == k:
                    scale[j] = exp2[k]
    over = 0
    nan = thr * 0 + np.nan
    for j in range(n):
        x = np.int64(bits[j])
        special = ((x >> width) & allexp) == allexp  # NaN or inf bench: log2 gives NaN / inf: the error is NaN
        u = abs((value(ds[j]) - bs[j]) * scale[j])
        u = nan if special else u
        ul[j] = u
        over += u > thr
    cnt[I_ULP_OVER] += over
    keys[M_ULP] = max(keys[M_ULP], _top(iul, n))


CHUNK = 2048  # elements per chunk of whole leaves: its buffers stay in the first two cache levels
_LOWEST = (-0x80000000, -0x8000000000000000)  # the smallest key of each width (32, 64 bits)
_ABSMASK = (0x7FFFFFFF, 0x7FFFFFFFFFFFFFFF)
_INF_KEY = (0x7F800000, 0x7FF0000000000000)


@compiled
def _key_limits(ints: Any) -> tuple[int, int, int]:
    """(the smallest key, the mask of a float's magnitude bits, inf's key) at the width of `ints`."""
    wide = 0 if ints.itemsize == 4 else 1
    return _LOWEST[wide], _ABSMASK[wide], _INF_KEY[wide]


@compiled
def _fresh_keys(keys: Any, lowest: int) -> Any:
    """`keys` with every maximum at its smallest key and the minimum at its largest."""
    keys[M_AE] = keys[M_BABS] = keys[M_DMAX] = keys[M_REL] = keys[M_ULP] = lowest
    keys[M_DMIN] = -(lowest + 1)
    return keys


@compiled
def metrics_plan(n: int) -> tuple[Any, Any, Any]:
    """(los, lens, bounds) of an output of n >= 1 elements: the leaves of numpy's pairwise tree of its sums, and
    the first leaf of each chunk of whole leaves (up to CHUNK elements), then the number of leaves."""
    los, lens = np.empty(max_leaves(n), np.int64), np.empty(max_leaves(n), np.int64)
    count = leaves(n, los, lens, np.empty((3, 64), np.int64))
    bounds = np.empty(count + 1, np.int64)
    chunks, first = 0, 0
    while first < count:
        bounds[chunks] = first
        first = chunk_last(los, lens, first, count, CHUNK) + 1
        chunks += 1
    bounds[chunks] = count
    return los[:count], lens[:count], bounds[:chunks + 1]


@compiled
def metrics_chunks(b: Any, d: Any, wd: Any, ints: Any, dev: int, do_ulp: bool, do_binary: bool, params: Any,
                   log2_fix: Any, top: int, exp2: Any, odd: Any, kmin: int, mb: int, emin: int, los: Any, lens: Any,
                   bounds: Any, k0: int, k1: int, sums: Any, ckeys: Any, cfacc: Any, ccnt: Any) -> None:
    """The statistics of chunks k0..k1 of b and d (metrics_plan's), each into its own row of ckeys (the maxima's
    keys; a chunk that holds a larger error than every earlier one of k0..k1, its key and first position, in ccnt's
    I_WORST: the candidates for numpy's argmax), cfacc (float64 sums) and ccnt (counts), and
    each leaf's sums of squares, ULP errors and relative errors into sums: the chunks' results do not depend
    on which call computed them, so either thread may take any of them (helper.share). `wd`: an empty array
    of the error dtype B (b's, or float32 beside a float64 b, which is rounded to it a chunk at a time);
    `ints`: an empty signed integer array of B's width; `log2_fix`, `top`: stats.log2_fix_table; `exp2`, `odd`,
    `kmin`: stats.exp2_table; `mb`, `emin`: the ULP's mantissa bits and smallest exponent. A compiled kernel: its arrays and constants come as arguments."""
    c = np.empty(len(params), wd.dtype)  # the parameters in the bench dtype, as numpy's operands are
    for k in range(len(params)):
        c[k] = params[k]
    leaf_start = c[P_LEAF]
    buf = np.empty((6, CHUNK), wd.dtype)
    ibuf = buf.view(ints.dtype)
    ebuf = np.empty(CHUNK, np.int64)
    sq, ul, rl = buf[0], buf[1], buf[2]
    lowest, absmask, inf_key = _key_limits(ints)
    best = lowest  # the largest error's key so far in these chunks: a chunk looks for its first position only
    for k in range(k0, k1):  # where it holds a larger one (a search per chunk cost 0.18 ns per element)
        first, last = bounds[k], bounds[k + 1] - 1
        lo = los[first]
        keys, facc, cnt = ckeys[k], cfacc[k], ccnt[k]
        _fresh_keys(keys, lowest)
        keys[M_AE] = best
        cnt[:] = 0
        _chunk(b, d, lo, los[last] + lens[last] - lo, c, dev, do_ulp, do_binary, log2_fix, top, exp2, odd, kmin, mb,
               emin, buf, ibuf, ebuf, absmask, inf_key, keys, facc, cnt)
        if keys[M_AE] == best:  # no larger error here: not a candidate (an earlier chunk holds the first one)
            keys[M_AE] = lowest
        else:
            best = keys[M_AE]
        for i in range(first, last + 1):
            off = los[i] - lo
            sums[0, i] = leaf(sq, off, lens[i], leaf_start)
            sums[1, i] = leaf(ul, off, lens[i], leaf_start) if do_ulp else leaf_start
            sums[2, i] = leaf(rl, off, lens[i], leaf_start)


@compiled
def metrics_finish(n: int, wd: Any, ints: Any, params: Any, sums: Any, ckeys: Any, cfacc: Any, ccnt: Any, out: Any,
                   iout: Any) -> None:
    """Every statistic of metrics/stats.py into out / iout from the chunks' results, taken in the chunks' order
    (the float64 sums added chunk by chunk, the largest error's first position), then numpy's pairwise sums
    from the leaves' (the tree's own order): the same bits as one pass over the chunks in order. A compiled kernel: its arrays and constants come as arguments."""
    lowest, absmask, inf_key = _key_limits(ints)
    keys = _fresh_keys(np.empty(6, ints.dtype), lowest)
    facc = np.zeros(len(out))
    iout[:] = 0
    for k in range(len(ckeys)):
        ck = ckeys[k]
        if ck[M_AE] > keys[M_AE] and keys[M_AE] <= inf_key:  # (not once a NaN is found)
            keys[M_AE], iout[I_WORST] = ck[M_AE], ccnt[k, I_WORST]
        for m in (M_BABS, M_DMAX, M_REL, M_ULP):
            keys[m] = max(keys[m], ck[m])
        keys[M_DMIN] = min(keys[M_DMIN], ck[M_DMIN])
        for f in (F_DOT_DB, F_DOT_DD, F_DOT_BB, F_SUM_REL):
            facc[f] += cfacc[k, f]
        for i in range(I_WORST + 1, len(iout)):
            iout[i] += ccnt[k, i]
    # the keys back to floats, through one row of the buffer
    fb = np.empty(6, wd.dtype)
    kb = fb.view(ints.dtype)
    kb[0], kb[1], kb[2], kb[3], kb[4] = keys[M_AE], keys[M_BABS], keys[M_REL], keys[M_ULP], keys[M_DMAX]
    kb[5] = keys[M_DMIN]
    for j in (4, 5):
        x = kb[j]
        kb[j] = x ^ ((x >> (8 * kb.itemsize - 1)) & absmask)
    out[F_MAX_AE], out[F_BENCH_ABSMAX], out[F_MAX_REL], out[F_MAX_ULP] = fb[0], fb[1], fb[2], fb[3]
    out[F_DEV_MAX], out[F_DEV_MIN] = fb[4], fb[5]
    if out[F_DEV_MAX] != out[F_DEV_MAX] or out[F_DEV_MIN] != out[F_DEV_MIN]:
        out[F_DEV_MAX] = out[F_DEV_MIN] = np.nan  # np.max and np.min: NaN wins
    for k in (F_DOT_DB, F_DOT_DD, F_DOT_BB, F_SUM_REL):
        out[k] = facc[k]
    eps = np.empty(1, wd.dtype)  # rounded to the bench dtype, as numpy's operand is
    eps[0] = params[P_EPS]
    zero = eps[0] * 0
    stack, left = np.empty((3, 64), np.int64), np.empty(64, wd.dtype)
    out[F_SUM_SQ] = zero + combine(n, sums[0], stack, left)  # numpy's reduce: the identity plus the pairwise sum
    out[F_SUM_ULP] = zero + combine(n, sums[1], stack, left)
    out[F_PW_REL] = zero + combine(n, sums[2], stack, left)
