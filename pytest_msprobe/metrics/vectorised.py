"""Vectorised numpy versions of msprobe's accuracy metrics (REFERENCE-msprobe.md §4.1, §4.2).

Every function is pure numpy, without torch, so it runs the same on every worker. The arithmetic keeps
msprobe's dtypes on purpose (float32 sums for fp16/bf16 outputs, float64 for fp32 outputs, numpy's
pairwise `mean`) so the numbers equal the ones msprobe writes, not merely come close. Thresholds are
arguments; the numbers live in api_specs/thresholds.yaml.
inf/NaN inputs are legal and give inf/NaN metrics, so numpy's floating-point warnings are silenced.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Callable, NamedTuple, TypeVar

import numpy as np

from ..records.columns import ALGORITHM_KEYS
from ..records.columns import METRIC_KEYS as METRIC_KEYS  # re-exported: the metrics' column order
from . import storage

if TYPE_CHECKING:  # typing.ParamSpec is Python 3.10's; the package runs on 3.9 (an Ascend host's torch_npu 2.1)
    from typing import ParamSpec  # novermin: never imported at run time

    _P = ParamSpec("_P")
_R = TypeVar("_R")


def _quiet(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Silence numpy floating-point warnings: inf - inf, 0 / 0 and log2(0) are expected here."""
    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return wrapper


# elements per float64 block of the cosine's dot products: they stay in cache, and below OpenBLAS's
# threshold for threading a dot (10,000), whose threads cost up to 50x on a busy machine
_DOT_BLOCK = 8192

COSINE_SCALAR_MSG = "All the data in device dump data is scalar. Please refer to other compare algorithms."
COSINE_BOTH_ZERO_MSG = "All the data in device and bench outputs are zero."
COSINE_DEVICE_ZERO_MSG = "All the data is zero in device dump data."
COSINE_BENCH_ZERO_MSG = "All the data is zero in bench dump data."
COSINE_NAN_MSG = "Dump data has NaN when comparing with Cosine Similarity."


class Peaks(NamedTuple):
    """What is known of a pair before its cosine: each side's max|x| and, where a pass summed them, their
    unscaled float64 dot products (n.g, n.n, g.g; used inside _SAFE_SCALE)."""
    device: float
    bench: float
    dots: tuple[float, float, float] | None = None


class Sides(NamedTuple):
    """An output's device values beside the bench as msprobe compares them (finite_mask): the bench rounded to the
    device dtype, and where both are finite; `device_dtype` names the device's numpy dtype where `device` holds
    its values wider (fp16 as float32)."""
    device: np.ndarray
    bench_dev: np.ndarray
    both_finite: np.ndarray
    device_dtype: np.dtype | None = None


class ErrorArrays:
    """The flat arrays every metric is built from, computed once per output. The relative errors are made
    only when a metric needs all of them: a small-valued output (optimizer state) whose max abs error
    passes Layer 1 needs none, and the benchmark and absolute-threshold metrics only those of its normal
    elements (`rel_err_at`), computed by the same operations, so every value is the same."""

    def __init__(self, abs_bench: np.ndarray, abs_err: np.ndarray, eps: float | np.floating) -> None:
        self.abs_bench = abs_bench  # |b|
        self.abs_err = abs_err      # |d - b|  (numpy promotion: fp32 for fp16 outputs, fp64 for fp32)
        self.eps = eps              # of |b| + eps, the relative error's denominator

    @functools.cached_property
    def rel_err(self) -> np.ndarray:
        """|d - b| / (|b| + eps)  (msprobe's rel_err_origin; both sides >= 0, so its extra abs() is the identity)."""
        with np.errstate(all="ignore"):
            rel: np.ndarray = self.abs_bench + self.eps
            np.divide(self.abs_err, rel, out=rel)
        return rel

    def _whole(self, count: int) -> bool:
        """Whether to use the whole array for `count` elements: it exists, or they are more than a quarter of
        it (two gathers per element cost more than the whole division)."""
        return "rel_err" in self.__dict__ or 4 * count > self.abs_err.size

    def count_rel_above(self, limit: float, mask: np.ndarray, count: int) -> int:
        """#(rel_err > limit) at a mask of `count` elements."""
        if self._whole(count):
            above: np.ndarray = self.rel_err > limit
            above &= mask
            return int(np.count_nonzero(above))
        return int(np.count_nonzero(self.rel_err_at(mask, count) > limit))

    def rel_err_at(self, where: np.ndarray | slice, count: int) -> np.ndarray:
        """The relative errors at a mask or slice of `count` elements; the whole array itself when that is
        every element."""
        if count == self.abs_err.size:
            return self.rel_err
        if self._whole(count):
            return self.rel_err[where]
        with np.errstate(all="ignore"):
            rel: np.ndarray = self.abs_err[where] / (self.abs_bench[where] + self.eps)
        return rel


def blank_metrics() -> dict[str, float | None]:
    """All metric columns blank (None is msprobe's " " cell)."""
    return dict.fromkeys(METRIC_KEYS)


@_quiet
def error_arrays(bench: np.ndarray, device: np.ndarray, eps: float | np.floating) -> ErrorArrays:
    """Shared error arrays; `eps` must be a numpy scalar of the bench dtype (or a Python float) so the
    sums stay in the bench dtype exactly as msprobe computes them."""
    abs_err = np.subtract(device, bench)
    np.abs(abs_err, out=abs_err)
    return ErrorArrays(np.abs(bench), abs_err, eps)


def max_abs(values: np.ndarray) -> np.floating:
    """max|x| in the array's dtype (NaN if any NaN); avoids a temporary |x| array."""
    peak: np.floating = np.maximum(np.max(values), -np.min(values))
    return peak


_SAFE_SCALE = (1e-100, 1e100)  # max|x| range whose float64 squares, summed, neither overflow nor underflow


def dots_unscaled(n_max: float, g_max: float) -> bool:
    """Whether both sides' float64 squares, summed unscaled, can neither overflow nor underflow (_SAFE_SCALE)."""
    lo, hi = _SAFE_SCALE
    return lo <= n_max <= hi and lo <= g_max <= hi


def _dots(n: np.ndarray, g: np.ndarray, n_max: float, g_max: float,
          bench_dtype: np.dtype) -> tuple[float, float, float]:
    """(n.g, n.n, g.g) in float64 for the cosine, which does not depend on the scale of either side.

    msprobe divides each side by its max|x| first so that the squares cannot overflow; in float64 that
    is only needed outside _SAFE_SCALE (never for fp32/fp16/bf16 outputs). The sides are widened to
    float64 a block at a time, so there is no float64 copy of the output, and each block's three dots
    run on it while it is in cache. Only the rounding order differs from msprobe's (~1e-16 relative).
    A block of bf16 storage is widened to its values, and of a wider bench rounded to `bench_dtype` first.
    """
    scale = not dots_unscaled(n_max, g_max)
    ng = nn = gg = 0.0
    for i in range(0, n.size, _DOT_BLOCK):
        nb = storage.widen(n[i:i + _DOT_BLOCK]).astype(np.float64)
        gb = g[i:i + _DOT_BLOCK].astype(bench_dtype, copy=False).astype(np.float64)
        if scale:
            nb /= n_max
            gb /= g_max
        ng += float(nb @ gb)
        nn += float(nb @ nb)
        gg += float(gb @ gb)
    return ng, nn, gg


@_quiet
def cosine(bench: np.ndarray, device: np.ndarray, *, zero_eps: float, pass_gt: float,
           bench_absmax: np.floating | None = None) -> tuple[float | None, bool, str]:
    """msprobe's cosine similarity in float64 (huge values cannot overflow: see _dots), single elements and all-zero pairs are not judged. Returns
    (value or None for a blank cell, passed, message). NaN anywhere gives (nan, False) like 8.3.3."""
    n = device.reshape(-1)
    g = bench.reshape(-1)
    if n.shape != g.shape or n.size < 2:
        return cosine_of(n, g, Peaks(0.0, 0.0), zero_eps=zero_eps, pass_gt=pass_gt)
    g_max = max_abs(g) if bench_absmax is None else bench_absmax
    return cosine_of(n, g, Peaks(float(max_abs(n)), float(g_max)), zero_eps=zero_eps, pass_gt=pass_gt)


@_quiet
def cosine_of(n: np.ndarray, g: np.ndarray, peaks: Peaks, *, zero_eps: float, pass_gt: float,
              bench_dtype: np.dtype | None = None) -> tuple[float | None, bool, str]:
    """The cosine of flat device `n` and bench `g` whose max|x| and dot products are `peaks`'s;
    `bench_dtype`: the dtype msprobe compares the bench in, where `g` is wider (read in place)."""
    n_max, g_max, dots = peaks
    if n.shape != g.shape:
        return -1.0, False, f"Shape of device and bench outputs don't match. device: {n.shape}, bench: {g.shape}."
    if n.size == 0:
        return None, False, "There is not bench calculation result."
    if n.size == 1:
        return None, True, COSINE_SCALAR_MSG
    if n_max <= zero_eps and g_max <= zero_eps:
        return None, True, COSINE_BOTH_ZERO_MSG
    if n_max <= zero_eps:
        return None, False, COSINE_DEVICE_ZERO_MSG
    if g_max <= zero_eps:
        return None, False, COSINE_BENCH_ZERO_MSG
    if dots is None or not dots_unscaled(n_max, g_max):
        dots = _dots(n, g, n_max, g_max, bench_dtype or g.dtype)
    ng, nn, gg = dots
    cos = ng / (math.sqrt(nn) * math.sqrt(gg))        # nn, gg > 0 here (max|x| > zero_eps), or NaN
    if math.isnan(cos):
        return float("nan"), False, COSINE_NAN_MSG
    cos = min(max(cos, -1.0), 1.0)
    return cos, cos > pass_gt, ""


def dual_ratio(rel_err: np.ndarray, threshold: float) -> tuple[float, bool]:
    """双百/双千/双万: fraction of elements with rel_err < t (strict); the check holds iff it is > 1 - t."""
    ratio = 1.0 if rel_err.size == 0 else float(np.count_nonzero(rel_err < threshold) / rel_err.size)
    return ratio, ratio > 1 - threshold


def binary_error_rate(bench: np.ndarray, device: np.ndarray) -> float:
    """Fraction of elements that differ (exact equality after numpy promotion)."""
    return float(np.count_nonzero(bench != device) / bench.size)


def _fraction(cond: np.ndarray, mask: np.ndarray, mask_count: int | None = None) -> float:
    """count(cond & mask) / count(mask), 0 when the mask is empty (msprobe's convention)."""
    total = np.count_nonzero(mask) if mask_count is None else mask_count
    if total == 0:
        return 0.0
    np.logical_and(cond, mask, out=cond)
    return float(np.count_nonzero(cond) / total)


@_quiet
def finite_mask(bench: np.ndarray, device: np.ndarray, device_dtype: np.dtype | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(both finite, bench rounded to the device dtype). The bench is rounded first, so a bench value that
    overflows the device dtype counts as non-finite; the rounded bench is reused by the error balance.
    `device` may hold the device values in a wider dtype (fp16 values as float32, which numpy handles much
    faster); `device_dtype` then names the real one and the rounded bench comes back in the wider dtype."""
    bench_dev = bench.astype(device.dtype if device_dtype is None else device_dtype, copy=False)
    bench_dev = bench_dev.astype(device.dtype, copy=False)
    both = np.isfinite(device)
    both &= np.isfinite(bench_dev)
    return both, bench_dev


def small_value_mask(abs_bench: np.ndarray, both_finite: np.ndarray, small_value: float) -> np.ndarray:
    """Finite elements whose |bench| <= small_value."""
    small: np.ndarray = np.less_equal(abs_bench, small_value)
    small &= both_finite
    return small


def error_balance(device: np.ndarray, bench_dev: np.ndarray) -> float:
    """误差均衡性: |#(d > b) - #(d < b)| / N with b rounded to the device dtype. Counting the comparisons
    equals counting the signs of d - b (a difference of distinct floats never rounds to zero)."""
    if device.size == 0:
        return 0.0
    return float(abs(np.count_nonzero(device > bench_dev) - np.count_nonzero(device < bench_dev)) / device.size)


@_quiet
def inf_nan_error_ratio(err: ErrorArrays, sides: Sides, rtol: float, clip_range: tuple[float, float]) -> float:
    """Among elements where either side is inf/NaN: fraction NOT matching after clipping both sides to the
    device dtype's finite range (|dc - bc| / (|b| + eps) <= rtol, or both NaN); the difference is taken in
    the device dtype, as msprobe does. Elementwise, so it is computed on the non-finite subset only."""
    device, bench_dev, both_finite, device_dtype = sides
    bad = ~both_finite
    n_bad = np.count_nonzero(bad)
    if n_bad == 0:
        return 0.0
    lo, hi = clip_range
    dt = device.dtype if device_dtype is None else device_dtype
    d = device[bad].astype(dt, copy=False)
    gc = np.clip(bench_dev[bad].astype(dt, copy=False), lo, hi)
    dc = np.clip(d, lo, hi)
    ok = np.abs(dc - gc) / (err.abs_bench[bad] + err.eps) <= rtol
    ok |= np.isnan(d) & np.isnan(gc)
    return float(np.count_nonzero(~ok) / n_bad)


@_quiet
def absolute_threshold_metrics(err: ErrorArrays, sides: Sides, *, rtol: float, small_value: float, atol: float,
                               clip_range: tuple[float, float]) -> dict[str, float]:
    """绝对阈值法: inf/nan error ratio, rel-error ratio on normal values (rel > rtol), abs-error ratio on
    small values (abs > atol)."""
    both_finite = sides.both_finite
    small = small_value_mask(err.abs_bench, both_finite, small_value)
    n_small = int(np.count_nonzero(small))
    normal = both_finite & ~small
    n_normal = int(np.count_nonzero(normal))
    return dict(zip(ALGORITHM_KEYS["absolute_threshold"], (
        inf_nan_error_ratio(err, sides, rtol, clip_range),
        err.count_rel_above(rtol, normal, n_normal) / n_normal if n_normal else 0.0,
        _fraction(err.abs_err > atol, small, n_small) if n_small else 0.0,
    )))


def rmse(abs_err: np.ndarray, keep: np.ndarray, n_kept: int, denominator_eps: float, additive: float) -> float:
    """Root mean square of the kept errors, corrected for the masked ones the way msprobe does:
    sqrt(mean(where(keep, ae, 0)**2) * (N / (N - k + denominator_eps) + additive)), k = N - n_kept
    masked elements. The mean is numpy's pairwise mean in the error dtype, as in msprobe."""
    def mean_square(masked: np.ndarray) -> np.float64:
        np.square(masked, out=masked)
        return np.float64(masked.mean())

    if not n_kept:  # the mean of zeros, without making them
        mse = np.float64(0.0)
    else:
        mse = mean_square(abs_err * keep)  # = np.where(keep, abs_err, 0) at a third of the cost ...
        if not np.isfinite(mse):  # ... unless an error is inf/NaN (inf * 0 is NaN, not msprobe's 0)
            mse = mean_square(np.where(keep, abs_err, 0))
    return float(np.sqrt(mse * (abs_err.size / (n_kept + denominator_eps) + additive)))


@_quiet
def benchmark_metrics(err: ErrorArrays, sides: Sides, *, small_value: float, atol: float,
                      rmse_fudge: tuple[float, float]) -> dict[str, float]:
    """标杆比对法: small-value error ratio, max/mean relative error and rmse over the normal (finite,
    not small) elements, error balance over all."""
    device, bench_dev, both_finite = sides.device, sides.bench_dev, sides.both_finite
    small = small_value_mask(err.abs_bench, both_finite, small_value)
    n_small = int(np.count_nonzero(small))
    normal = both_finite & ~small                       # = not (small or inf/nan)
    n_normal = int(np.count_nonzero(normal))
    rel_normal = err.rel_err_at(normal, n_normal)  # the same elements, in order, as msprobe's rel_err[rel_err >= 0]
    return dict(zip(ALGORITHM_KEYS["benchmark"], (
        _fraction(err.abs_err > atol, small, n_small) if n_small else 0.0,
        float(rel_normal.max()) if rel_normal.size else 0.0,
        float(rel_normal.mean()) if rel_normal.size else 0.0,
        rmse(err.abs_err, normal, n_normal, *rmse_fudge),
        error_balance(device, bench_dev),
    )))


@_quiet
def ulp_errors(bench: np.ndarray, device: np.ndarray, abs_bench: np.ndarray, *, mantissa_bits: int,
               min_exponent: int, compute_dtype: np.dtype | str) -> np.ndarray:
    """Per-element error in units of the device dtype's last place at the bench value:
    |(d - b) * 2**(mantissa_bits - eb)|, eb = max(floor(log2|b|), min_exponent) with log2 in the bench
    dtype. msprobe's quirk is kept: for b == 0 the exponent is 0, not min_exponent, so the unit there is
    2**-mantissa_bits (huge) and errors around zero are almost ignored."""
    cd = np.dtype(compute_dtype)
    eb = np.log2(abs_bench)
    np.floor(eb, out=eb)
    np.copyto(eb, 0, where=abs_bench == 0)
    np.maximum(eb, min_exponent, out=eb)
    scale = np.exp2(mantissa_bits - eb).astype(cd, copy=False)
    ulp: np.ndarray = np.subtract(device.astype(cd, copy=False), bench).astype(cd, copy=False)
    ulp *= scale
    np.abs(ulp, out=ulp)
    return ulp


@_quiet
def ulp_errors_fp8(bench: np.ndarray, device: np.ndarray, *, exponent_floor: float,
                   mantissa_width: dict[int, int]) -> np.ndarray:
    """|ULP error| of fp8 outputs as msprobe 26.x measures them, in float64: a tapered format whose mantissa
    width depends on the bench value's exponent e = floor(max(log2|b|, exponent_floor)): the width of the first
    `mantissa_width` key >= |e|, else 0, where the error is the difference of the signed log2 magnitudes.
    Two departures from msprobe: it keeps the sign (so counts only device values above the bench) and floors
    only the bench's log2 (so an exact zero on both sides is 978 ULP off); here both directions count and
    both sides are floored."""
    x, d = np.asarray(bench, dtype=np.float64), np.asarray(device, dtype=np.float64)
    tiny = 2.0 ** -1000
    ex = np.maximum(np.log2(np.abs(x) + tiny), exponent_floor)
    exponent = np.floor(ex)
    width = np.zeros_like(x)
    for limit, bits in sorted(mantissa_width.items(), reverse=True):
        width[np.abs(exponent) <= int(limit)] = bits
    err = (d - x) * np.exp2(width - exponent)
    eh = np.maximum(np.log2(np.abs(d) + tiny), exponent_floor)
    log_err = eh * np.where(d >= 0, 1.0, -1.0) - ex * np.where(x >= 0, 1.0, -1.0)
    return np.abs(np.where(width == 0, log_err, err))


@_quiet
def ulp_metrics(ulp: np.ndarray, elem_threshold: float) -> dict[str, float]:
    """ULP误差最大值 / 平均值 / 大于阈值占比 (mean is numpy's pairwise mean in the compute dtype)."""
    return dict(zip(ALGORITHM_KEYS["ulp_compare"], (
        float(ulp.max()),
        float(ulp.mean()),
        float(np.count_nonzero(ulp > elem_threshold) / ulp.size),
    )))


def zero_fraction_diff(bench: np.ndarray, device: np.ndarray) -> float:
    """Dropout rule: |#zeros(b) - #zeros(d)| / numel(b)."""
    return float(abs(np.count_nonzero(bench == 0) - np.count_nonzero(device == 0)) / bench.size)
