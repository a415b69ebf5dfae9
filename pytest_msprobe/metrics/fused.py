"""msprobe's metric columns of one float output from one set of statistics, taken in one pass.

`MetricStats` is the definition every implementation fills (today the compiled pass, metrics/kernel.py;
metrics/vectorised.py computes the same columns in numpy and is the oracle). Notation: `b` the bench in
its numpy dtype B (float32 for bf16/fp16/fp32 benches, float64 for fp64 ones), which is also the error
dtype; `d` the device values, exactly widened to B; all flat, `n` elements; `eps`, `small_value`,
`atol`, `rtol` the thresholds of the output's dtype and algorithm, rounded to B as numpy rounds a Python
scalar (NEP 50):

* `ae = |d - b|`, `rel = ae / (|b| + eps)`, both in B;
* `bench_dev` = b in the device's numpy dtype (float32 for bf16), compared in d's dtype;
  `finite` = isfinite(d) and isfinite(bench_dev); `small` = finite and |b| <= small_value;
  `normal` = finite and not small.

Every column is a function of these statistics (`layer1`, `layer2`), so any pass that fills them
exactly gets msprobe's columns. Sums marked *pairwise* are numpy's pairwise sum in B over all n elements
in index order (numpy's `mean` then divides in float64 and rounds to B); the float64 sums are in any
order (cosine, mean relative error: a different order moves them by ~1e-16 and ~1e-7 relative).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..helper import share
from . import storage
from . import vectorised as M


@dataclass
class MetricStats:
    n: int
    max_abs_err: float        # max ae (NaN if any element's is NaN), a value of B
    worst: int                # np.argmax(ae): the first NaN, else the first largest
    bench_absmax: float       # max |b| (NaN if any)
    device_max: float         # max d, min d (NaN if any)
    device_min: float
    dot_db: float             # sum d*b, d*d, b*b in float64 (any order): the cosine's
    dot_dd: float
    dot_bb: float
    rel_below: dict[float, int]  # threshold t -> #(rel < t) over all n (Layer 1's dual ratios)
    n_small: int              # #small, and #(small and ae > atol)
    n_small_over: int
    n_normal: int             # #normal, and #(normal and rel > rtol)
    n_normal_over: int
    max_rel_normal: float     # max rel over normal elements (-inf when none)
    sum_rel_normal: float     # sum rel over normal elements, float64 (any order)
    pairwise_rel_normal: float  # pairwise sum of (rel if normal else 0), in B (numpy's mean when all are normal)
    sum_sq_normal: float      # pairwise sum of (ae if normal else 0)**2, in B
    n_up: int                 # #(d > bench_dev), #(d < bench_dev)
    n_down: int
    n_nonfinite: int          # #(not finite)
    n_differ: int | None = None   # #(b != d), binary_consistency only
    max_ulp: float | None = None  # ulp_compare only: max (NaN if any), pairwise sum in B, #(> threshold) of
    sum_ulp: float | None = None  # ulp = |(d - b) * 2**(mantissa - max(floor(log2|b|), min_exponent))|
    n_ulp_over: int | None = None  # (vectorised.ulp_errors, numpy's log2 and exp2 in B included)


@dataclass(frozen=True)
class Limits:
    """The thresholds of one output's statistics (Python floats; the pass rounds them to B)."""
    eps: float
    small_value: float
    atol: float
    rtol: float
    dual: tuple[float, float, float]       # Layer 1's hundredth, thousandth, ten-thousandth
    ulp: tuple[int, int, float] | None = None  # (mantissa bits, min exponent, element threshold)
    binary: bool = False


def supported(b: np.ndarray, d: np.ndarray, dev_dtype: np.dtype[Any], ulp_dtype: str | None = None,
              work: np.dtype[Any] | None = None) -> bool:
    """Whether the compiled pass computes this pair as numpy does: the error dtype is the bench's (float32
    or float64), the device values are of it or float32 beside float64, and the ULP errors (ulp_compare,
    computed in `ulp_dtype`) are computed in it too. A bf16 or fp16 output's storage (metrics/storage.py) is read
    as it is beside a float32 bench (and an fp16 one beside a float64 bench too: its values widen exactly); `work`:
    the error dtype B where it is float32 and the bench float64 (a bf16 output's, which msprobe compares in
    float32: the pass rounds it a chunk at a time, no copy)."""
    work = np.dtype(b.dtype if work is None else work)
    if work != b.dtype and (work != np.float32 or b.dtype != np.float64):
        return False
    held = np.float32 if storage.is_bits(d) and work == np.float32 or d.dtype == np.float16 else d.dtype
    if b.dtype not in (np.float32, np.float64) or held not in (work, np.float32) or not d.size:
        return False
    if dev_dtype not in (work, np.float32, np.float16):
        return False
    return ulp_dtype is None or np.dtype(ulp_dtype) == work


def compute(b: np.ndarray, d: np.ndarray, dev_dtype: np.dtype[Any], limits: Limits,
            work: np.dtype[Any] | None = None) -> MetricStats:
    """The statistics of a supported pair (flat, contiguous), from the compiled pass; `work` as for
    `supported`."""
    b = np.ascontiguousarray(b)
    p = Pass(d, dev_dtype, limits, np.dtype(b.dtype if work is None else work))

    def pass_over(k0: int, k1: int) -> None:
        p.chunks(b, p.d, p.los, k0, k1)

    share(p.count, GRAIN, pass_over)  # in the helper thread, the item's thread may take chunks while it waits
    return p.finish()


class Pass:
    """One output's compiled metric pass: its plan (numpy's pairwise tree, in chunks of whole leaves), the
    chunks' results, and `finish`, which combines them in the chunks' order. The chunks may be computed in any
    calls and threads (`chunks`), each reading arrays that start at any element (metrics/streamed.py)."""

    def __init__(self, d: np.ndarray, dev_dtype: np.dtype[Any], limits: Limits, w: np.dtype[Any]) -> None:
        from . import kernel as K  # numba: imported on the first check, not at collection

        self.K, self.limits, self.w = K, limits, w
        # float32 beside float64: widened; bf16 or fp16 storage beside float32: read as it is (storage.kernel_view)
        self.d = storage.kernel_view(np.ascontiguousarray(d, dtype=d.dtype if d.itemsize == 2 else w))
        self.n = int(self.d.size)
        # msprobe's bench_dev: the bench itself, rounded to float32 or to fp16 in the pass (no copy)
        self.dev = K.DEV_SAME if dev_dtype == w else K.DEV_FP32 if dev_dtype == np.float32 else K.DEV_FP16
        self.mb, self.emin, thr = limits.ulp if limits.ulp is not None else (0, 0, 0.0)
        self.fix, self.top = log2_fix_table(w.char)
        self.exp2, self.odd, self.kmin = exp2_table(w.char, self.mb, self.emin)
        self.params = np.array([limits.eps, limits.small_value, limits.atol, limits.rtol, *limits.dual, thr,
                                LEAF_START])
        self.out, self.iout = np.empty(K.F_PW_REL + 1), np.empty(K.I_ULP_OVER + 1, dtype=np.int64)
        self.ints, self.wd = np.empty(0, dtype=np.int32 if w == np.float32 else np.int64), np.empty(0, dtype=w)
        self.los, self.lens, self.bounds = K.metrics_plan(self.n)
        self.count = len(self.bounds) - 1
        self.sums = np.empty((3, len(self.los)), dtype=w)
        self.ckeys = np.empty((self.count, 6), self.ints.dtype)
        self.cfacc = np.zeros((self.count, len(self.out)))
        self.ccnt = np.empty((self.count, len(self.iout)), np.int64)

    def chunks(self, b: np.ndarray, d: np.ndarray, los: np.ndarray, k0: int, k1: int) -> None:
        """Chunks k0..k1 of arrays b and d whose element 0 is the output's element at los[leaf] - `los`[leaf]."""
        self.K.metrics_chunks(b, d, self.wd, self.ints, self.dev, self.limits.ulp is not None, self.limits.binary,
                              self.params, self.fix, self.top, self.exp2, self.odd, self.kmin, self.mb, self.emin,
                              los, self.lens, self.bounds, k0, k1, self.sums, self.ckeys, self.cfacc, self.ccnt)

    def finish(self) -> MetricStats:
        K, out, iout, limits = self.K, self.out, self.iout, self.limits
        K.metrics_finish(self.n, self.wd, self.ints, self.params, self.sums, self.ckeys, self.cfacc, self.ccnt, out,
                         iout)
        ulp = limits.ulp is not None
        return MetricStats(
            n=self.n, max_abs_err=float(out[K.F_MAX_AE]), worst=int(iout[K.I_WORST]),
            bench_absmax=float(out[K.F_BENCH_ABSMAX]), device_max=float(out[K.F_DEV_MAX]),
            device_min=float(out[K.F_DEV_MIN]), dot_db=float(out[K.F_DOT_DB]), dot_dd=float(out[K.F_DOT_DD]),
            dot_bb=float(out[K.F_DOT_BB]),
            rel_below=dict(zip(limits.dual, (int(iout[k]) for k in (K.I_LT100, K.I_LT1000, K.I_LT10000)))),
            n_small=int(iout[K.I_SMALL]), n_small_over=int(iout[K.I_SMALL_OVER]), n_normal=int(iout[K.I_NORMAL]),
            n_normal_over=int(iout[K.I_NORMAL_OVER]), max_rel_normal=float(out[K.F_MAX_REL]),
            sum_rel_normal=float(out[K.F_SUM_REL]), pairwise_rel_normal=float(out[K.F_PW_REL]),
            sum_sq_normal=float(out[K.F_SUM_SQ]), n_up=int(iout[K.I_UP]),
            n_down=int(iout[K.I_DOWN]), n_nonfinite=int(iout[K.I_NONFINITE]),
            n_differ=int(iout[K.I_DIFFER]) if limits.binary else None,
            max_ulp=float(out[K.F_MAX_ULP]) if ulp else None, sum_ulp=float(out[K.F_SUM_ULP]) if ulp else None,
            n_ulp_over=int(iout[K.I_ULP_OVER]) if ulp else None)


GRAIN = 64  # chunks (of up to 2,048 elements) per call of the pass: about 0.3 ms of work against ~10 us to call it
# where numpy's short pairwise leaves start: -0.0 from numpy 2 on, else 0.0
LEAF_START = float(np.add.reduceat(np.array([-0.0, -0.0]), [0])[0])
_LOG2_TOP = {"f": 256, "d": 1024}  # mantissas below a power of two whose numpy log2 may round up to it


@functools.lru_cache(maxsize=2)
def log2_fix_table(char: str) -> tuple[np.ndarray, int]:
    """Per biased exponent, floor(numpy's log2) minus the exponent for the `top` largest mantissas (numpy's
    log2 in float32 rounds 2**e * (1 - 2**-24) up to e; its float64 one likewise, and SIMD versions may
    differ by machine, so the table is numpy's own, made on this machine once per process)."""
    dtype = np.dtype(char)
    width, top = (23, _LOG2_TOP["f"]) if dtype == np.float32 else (52, _LOG2_TOP["d"])
    exps = 1 << (dtype.itemsize * 8 - 1 - width)
    biased = np.arange(exps, dtype=np.uint64)[:, None]
    mant = np.uint64((1 << width) - top) + np.arange(top, dtype=np.uint64)[None, :]
    values = (biased * np.uint64(1 << width) + mant).astype(np.uint32 if dtype == np.float32 else np.uint64)
    with np.errstate(all="ignore"):
        fix = np.floor(np.log2(values.view(dtype))) - (biased.astype(np.float64) - (exps // 2 - 1))
    fix[0], fix[-1] = 0, 0  # subnormals and NaN/inf are handled apart
    return fix.astype(np.int64), top


@functools.lru_cache(maxsize=8)
def exp2_table(char: str, mantissa: int, emin: int) -> tuple[np.ndarray, np.ndarray, int]:
    """numpy's exp2 in the bench dtype of every integer mantissa - eb can take (eb from emin, or 0, up to
    one above the largest exponent), the indices where it is not the exact power of two (numpy's float32
    exp2 gives 2**127 one ULP high), and the first exponent."""
    dtype = np.dtype(char)
    emax = 128 if dtype == np.float32 else 1024
    kmin, kmax = mantissa - emax, mantissa - min(emin, 0)
    k = np.arange(kmin, kmax + 1)
    with np.errstate(all="ignore"):
        table = np.exp2(k.astype(dtype))
        exact = np.ldexp(np.ones(k.size, dtype), k.astype(np.int32))
    return table, np.flatnonzero(table != exact).astype(np.int64), kmin


def dual(stats: MetricStats, threshold: float) -> tuple[float, bool]:
    """vectorised.dual_ratio from the counts."""
    ratio = float(stats.rel_below[threshold] / stats.n)
    return ratio, ratio > 1 - threshold


def mean_in(dtype: np.dtype[Any], total: float, n: int) -> float:
    """numpy's `mean` of n values of `dtype` whose sum (in that dtype) is `total`: divided in float64,
    rounded to the dtype."""
    return float(dtype.type(total / n))


def cosine(stats: MetricStats, d: np.ndarray, b: np.ndarray, *, zero_eps: float,
           pass_gt: float, work: np.dtype[Any] | None = None) -> tuple[float | None, bool, str]:
    """vectorised.cosine from the statistics (its float64 dot products in another order)."""
    n_max = float(max(stats.device_max, -stats.device_min)) if not math.isnan(stats.device_max + stats.device_min) \
        else math.nan
    dots = (stats.dot_db, stats.dot_dd, stats.dot_bb)
    return M.cosine_of(d, b, n_max, stats.bench_absmax, zero_eps=zero_eps, pass_gt=pass_gt, dots=dots,
                       bench_dtype=work)


def layer2(stats: MetricStats, algo: str, dtype: np.dtype[Any], *, rmse_fudge: tuple[float, float] = (0.0, 0.0),
           inf_nan: float = 0.0) -> dict[str, float]:
    """The Layer-2 columns of `algo` (vectorised's functions, from the statistics); `dtype` is B;
    `inf_nan`: the inf/nan error ratio, computed apart on the non-finite elements (0 when there are none)."""
    n = stats.n
    if algo == "binary_consistency":
        return {"binary_error_rate": float((stats.n_differ or 0) / n)}
    if algo == "ulp_compare":
        return {"max_ulp_err": float(stats.max_ulp or 0.0), "mean_ulp_err": mean_in(dtype, stats.sum_ulp or 0.0, n),
                "ulp_err_proportion": float((stats.n_ulp_over or 0) / n)}
    small = float(stats.n_small_over / stats.n_small) if stats.n_small else 0.0
    balance = float(abs(stats.n_up - stats.n_down) / n)
    if algo == "benchmark":
        normal = stats.n_normal
        mse = np.float64(mean_in(dtype, stats.sum_sq_normal, n)) if normal else np.float64(0.0)
        return {"small_value_err_ratio": small,
                "max_rel_err": float(stats.max_rel_normal) if normal else 0.0,
                "mean_rel_err": _mean_rel(stats, dtype) if normal else 0.0,
                "rmse": float(np.sqrt(mse * (n / (normal + rmse_fudge[0]) + rmse_fudge[1]))),
                "error_balance": balance}
    out = {"inf_nan_err_ratio": inf_nan,
           "rel_err_ratio": stats.n_normal_over / stats.n_normal if stats.n_normal else 0.0,
           "abs_err_ratio": small}
    if algo == "accumulative_error_compare":
        out["error_balance"] = balance
    return out


def _mean_rel(stats: MetricStats, dtype: np.dtype[Any]) -> float:
    """The mean relative error of the normal elements: numpy's own where every element is normal (the
    pairwise sum over all n is then theirs); else from the float64 sum, within ~1e-7 relative of numpy's
    pairwise sum in B over the normal elements alone."""
    total = stats.pairwise_rel_normal if stats.n_normal == stats.n else stats.sum_rel_normal
    return mean_in(dtype, total, stats.n_normal)
