"""msprobe's metric statistics (metrics/stats.py) of one output in numpy: the reference the other backends are held to
(tests/test_fused_metrics.py), never chosen by the plugin.

Each element is computed by the operations the compiled pass (metrics/numba_kernel.py) takes, as whole-array numpy
ones in the error dtype B: the maxima, positions, counts and the pairwise sums in B are the compiled pass's bit for
bit; the float64 sums (the cosine's dot products, the relative errors' sum) are taken in numpy's order.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import storage
from . import vectorised as M
from .stats import Limits, MetricStats


def compute(b: np.ndarray, d: np.ndarray, dev_dtype: np.dtype[Any], limits: Limits,
            work: np.dtype[Any] | None = None) -> MetricStats:
    """The statistics of a pair that fused.supported accepts, by whole-array numpy operations in B (`work`, else
    the bench's dtype)."""
    w = np.dtype(b.dtype if work is None else work)
    with np.errstate(all="ignore"):
        bs = np.asarray(b).reshape(-1).astype(w, copy=False)
        dv = storage.widen(np.asarray(d).reshape(-1)).astype(w)  # exact: every device dtype widens into B
        bv = bs if np.dtype(dev_dtype) == w else bs.astype(dev_dtype).astype(w)  # msprobe's bench_dev
        eps, small, atol, rtol = (w.type(v) for v in (limits.eps, limits.small_value, limits.atol, limits.rtol))
        zero = w.type(0.0)
        ae = np.abs(dv - bs)
        ab = np.abs(bs)
        rel = ae / (ab + eps)
        fin = np.isfinite(dv) & np.isfinite(bv)
        sm, nm = fin & (ab <= small), fin & (ab > small)
        rl, kept = np.where(nm, rel, zero), np.where(nm, ae, zero)
        fd, fb = storage.widen(np.asarray(d).reshape(-1)).astype(np.float64), bs.astype(np.float64)
        ulp = None
        if limits.ulp is not None:
            mb, emin, thr = limits.ulp
            ul = M.ulp_errors(bs, dv, ab, mantissa_bits=mb, min_exponent=emin, compute_dtype=w)
            ulp = float(ul.max()), float(np.add.reduce(ul)), int(np.count_nonzero(ul > w.type(thr)))
        return MetricStats(
            n=int(bs.size), max_abs_err=float(ae.max()), worst=int(np.argmax(ae)), bench_absmax=float(ab.max()),
            device_max=float(dv.max()), device_min=float(dv.min()), dot_db=float(fd @ fb), dot_dd=float(fd @ fd),
            dot_bb=float(fb @ fb), rel_below={t: int(np.count_nonzero(rel < w.type(t))) for t in limits.dual},
            n_small=int(np.count_nonzero(sm)), n_small_over=int(np.count_nonzero(sm & (ae > atol))),
            n_normal=int(np.count_nonzero(nm)), n_normal_over=int(np.count_nonzero(nm & (rel > rtol))),
            max_rel_normal=float(rl.max()), sum_rel_normal=float(np.sum(rl, dtype=np.float64)),
            pairwise_rel_normal=float(np.add.reduce(rl)), sum_sq_normal=float(np.add.reduce(kept * kept)),
            n_up=int(np.count_nonzero(dv > bv)), n_down=int(np.count_nonzero(dv < bv)),
            n_nonfinite=int(np.count_nonzero(~fin)),
            n_differ=int(np.count_nonzero(bs != dv)) if limits.binary else None,
            max_ulp=None if ulp is None else ulp[0], sum_ulp=None if ulp is None else ulp[1],
            n_ulp_over=None if ulp is None else ulp[2])
