"""msprobe's metric statistics of one float output in one compiled pass (numba): the host backend (backends.py).

The pass (metrics/numba_kernel.py) reads the output in chunks of whole leaves of numpy's pairwise tree; `Pass` holds
its plan and the chunks' results, which any call and thread may compute (`compute` shares them with the helper
thread; metrics/streamed.py feeds them a bench in pieces) and `finish` combines in the chunks' order. The statistics
are metrics/stats.py's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..helper import share
from . import storage

# Limits, MetricStats, cosine, dual and layer2 re-exported: verdict/standards.py reads them here
from .stats import LEAF_START, exp2_table, log2_fix_table
from .stats import Limits as Limits
from .stats import MetricStats as MetricStats
from .stats import cosine as cosine
from .stats import dual as dual
from .stats import layer2 as layer2


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
        from . import numba_kernel as K  # numba: imported on the first check, not at collection

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
