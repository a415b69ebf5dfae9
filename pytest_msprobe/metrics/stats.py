"""msprobe's metric columns of one float output from one set of statistics, taken in one pass.

`MetricStats` is the definition every backend fills (metrics/backends.py lists them: numpy, the compiled pass,
torch on the device, streamed); metrics/vectorised.py computes the same columns in numpy directly and is the oracle. Notation: `b` the bench in
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

from ..records.columns import ALGORITHM_KEYS
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
    return M.cosine_of(d, b, M.Peaks(n_max, stats.bench_absmax, dots), zero_eps=zero_eps, pass_gt=pass_gt,
                       bench_dtype=work)


def layer2(stats: MetricStats, algo: str, dtype: np.dtype[Any], *, rmse_fudge: tuple[float, float] = (0.0, 0.0),
           inf_nan: float = 0.0) -> dict[str, float]:
    """The Layer-2 columns of `algo` (vectorised's functions, from the statistics); `dtype` is B;
    `inf_nan`: the inf/nan error ratio, computed apart on the non-finite elements (0 when there are none)."""
    n = stats.n
    if algo == "binary_consistency":
        return dict(zip(ALGORITHM_KEYS[algo], (float((stats.n_differ or 0) / n),)))
    if algo == "ulp_compare":
        return dict(zip(ALGORITHM_KEYS[algo], (float(stats.max_ulp or 0.0), mean_in(dtype, stats.sum_ulp or 0.0, n),
                                               float((stats.n_ulp_over or 0) / n))))
    small = float(stats.n_small_over / stats.n_small) if stats.n_small else 0.0
    balance = float(abs(stats.n_up - stats.n_down) / n)
    if algo == "benchmark":
        normal = stats.n_normal
        mse = np.float64(mean_in(dtype, stats.sum_sq_normal, n)) if normal else np.float64(0.0)
        return dict(zip(ALGORITHM_KEYS[algo], (small, float(stats.max_rel_normal) if normal else 0.0,
                                               _mean_rel(stats, dtype) if normal else 0.0,
                                               float(np.sqrt(mse * (n / (normal + rmse_fudge[0]) + rmse_fudge[1]))),
                                               balance)))
    ratios = (inf_nan, stats.n_normal_over / stats.n_normal if stats.n_normal else 0.0, small)
    if algo == "accumulative_error_compare":
        return dict(zip(ALGORITHM_KEYS[algo], (*ratios, balance)))
    return dict(zip(ALGORITHM_KEYS["absolute_threshold"], ratios))


def _mean_rel(stats: MetricStats, dtype: np.dtype[Any]) -> float:
    """The mean relative error of the normal elements: numpy's own where every element is normal (the
    pairwise sum over all n is then theirs); else from the float64 sum, within ~1e-7 relative of numpy's
    pairwise sum in B over the normal elements alone."""
    total = stats.pairwise_rel_normal if stats.n_normal == stats.n else stats.sum_rel_normal
    return mean_in(dtype, total, stats.n_normal)
