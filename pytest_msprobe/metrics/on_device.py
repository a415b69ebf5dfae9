"""msprobe's metric statistics of one output in torch ops, on the device where the output lives (the `torch` backend,
backends.py).

On an accelerator host the device output stays where it is: the bench is copied there once, and only the
statistics (two small tensors) and later the worst element come back, instead of the whole output for the
compiled host pass (metrics/numba_kernel.py). Each element is computed by the same operations in the same dtype B
as there (metrics/stats.py's definitions: `b` the bench rounded to B, `d` the device values widened to B, the
ULP scale from numpy's own log2 and exp2 tables, stats.log2_fix_table and stats.exp2_table, indexed on the device), so
maxima, positions and counts are the host pass's exactly. The sums are torch's, in float64: the cosine's dot
products, as on the host, and the three that the host takes as numpy's pairwise sum in B (the squares behind
the RMSE, the relative errors behind the mean relative error, the ULP errors behind their mean), which then
differ from the host's by the rounding of a sum in B (about 1e-7 relative in float32): those three columns
and the cosine differ in their last digits, every other column is the same.

What this pass does not cover is left to the host pass (None): an output holding a non-finite element (the
host's careful path reads its values), and an fp16 output beside a float64 bench (torch rounds float64 to
fp16 through float32, numpy directly, and msprobe's bench_dev is numpy's). Imported only by a check that runs
on a device (torch is loaded by then).
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from . import stats

CHUNK_CPU = 1 << 18  # elements per chunk: a few MB of temporaries on a CPU (how CI runs this path)
CHUNK_ACCELERATOR = 1 << 22  # tens of MB on an accelerator, enough elements for each torch call
_TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
# msprobe's columns this pass takes from sums in another order than the host's: they differ in their last digits
SUMMED_COLUMNS = ("cosine", "rmse", "mean_rel_err", "mean_ulp_err")
# the counts, in the order of their row (one tensor on the device, one copy back)
_I = ("lt0", "lt1", "lt2", "n_small", "n_small_over", "n_normal", "n_normal_over", "n_up", "n_down", "n_nonfinite",
      "n_differ", "n_ulp_over")


@functools.lru_cache(maxsize=16)
def _ulp_tables(char: str, mantissa: int, emin: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int,
                                                                                      int]:
    """numpy's log2 fix and exp2 tables (stats.py) on `device`, with the first fixed mantissa and exp2's first
    exponent: made once per process and device."""
    fix, top = stats.log2_fix_table(char)
    exp2, _, kmin = stats.exp2_table(char, mantissa, emin)
    width = 23 if char == "f" else 52
    return torch.from_numpy(fix).to(device), torch.from_numpy(exp2).to(device), (1 << width) - top, kmin


def _ulp_errors(bs: torch.Tensor, dv: torch.Tensor, mb: int, emin: int) -> torch.Tensor:
    """vectorised.ulp_errors of finite values, as metrics/numba_kernel.py's _ulps makes them from the bench's bits:
    |(d - b) * 2**(mb - max(floor(log2|b|), emin))|, the exponent of b == 0 being 0 (msprobe's quirk), the scale
    numpy's exp2 of it (exact powers of two but where numpy's is not: stats.exp2_table)."""
    narrow = bs.dtype == torch.float32
    width, bias, allexp = (23, 127, 255) if narrow else (52, 1023, 2047)
    fix, exp2, first, kmin = _ulp_tables("f" if narrow else "d", mb, emin, bs.device)
    bits = bs.view(torch.int32 if narrow else torch.int64).to(torch.int64)
    biased, mant = (bits >> width) & allexp, bits & ((1 << width) - 1)
    near = (mant >= first) & (biased != 0)  # numpy's log2 rounds up to the next integer just below a power of two
    up = torch.where(near, fix[biased, torch.where(near, mant - first, 0)], 0)
    e = torch.clamp(biased - bias + up, min=emin)
    e = torch.where(biased == 0, torch.where(mant == 0, 0 if emin < 0 else emin, emin), e)
    return ((dv - bs) * exp2[mb - e - kmin]).abs()


def compute(b: torch.Tensor, d: torch.Tensor, dev_dtype: np.dtype[Any], limits: stats.Limits,
            work: np.dtype[Any]) -> stats.MetricStats | None:
    """The statistics of fused.compute for a bench `b` (float32 or float64) and a device output `d` (bf16, fp16,
    float32 or float64 values) of one shape on one device; `dev_dtype` the numpy dtype of d's values (float32 for
    bf16), `work` the error dtype B. None where the host pass must take it (the module's docstring)."""
    w = _TORCH[np.dtype(work)]
    dev_dtype = np.dtype(dev_dtype)
    same = dev_dtype == np.dtype(work)
    if (not same and dev_dtype == np.float16 and b.dtype == torch.float64) or d.numel() == 0:
        return None
    b, d = b.reshape(-1), d.reshape(-1)
    n, dev = d.numel(), d.device

    def scalar(value: float) -> torch.Tensor:  # a parameter rounded to B, as numpy rounds a weak Python scalar
        return torch.tensor(value, dtype=w, device=dev)

    eps, small, atol, rtol = (scalar(v) for v in (limits.eps, limits.small_value, limits.atol, limits.rtol))
    dual = [scalar(t) for t in limits.dual]
    zero = scalar(0.0)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=dev)
    # running totals as 0-d float64 tensors on the device: maxima (of values of B, exact in float64), sums
    top = dict.fromkeys(("max_abs_err", "bench_absmax", "device_max", "max_rel_normal", "max_ulp"), -inf)
    device_min, sums = inf, dict.fromkeys(("dot_db", "dot_dd", "dot_bb", "sum_rel", "sum_sq", "sum_ulp"), zero.double())
    counts = torch.zeros(len(_I), dtype=torch.int64, device=dev)
    worst: list[tuple[torch.Tensor, torch.Tensor]] = []  # per chunk: its largest error and its first position
    step = CHUNK_CPU if dev.type == "cpu" else CHUNK_ACCELERATOR
    for start in range(0, n, step):
        raw = d[start:start + step]
        bs, dv = b[start:start + step].to(w), raw.to(w)
        # msprobe's bench_dev: the bench in the device's numpy dtype, compared in B
        bv = bs if same else bs.to(torch.float32 if dev_dtype == np.float32 else torch.float16).to(w)
        ae, ab = (dv - bs).abs(), bs.abs()
        rel = ae / (ab + eps)
        fin = torch.isfinite(dv) & torch.isfinite(bv)
        sm, nm = fin & (ab <= small), fin & (ab > small)
        kept, rl = torch.where(nm, ae, zero), torch.where(nm, rel, zero)
        fd, fb = raw.to(torch.float64), bs.to(torch.float64)
        at = torch.argmax(ae)  # its first largest: the chunk's candidate for np.argmax
        worst.append((ae[at].double(), at + start))
        for key, x in (("max_abs_err", ae), ("bench_absmax", ab), ("device_max", dv), ("max_rel_normal", rl)):
            top[key] = torch.maximum(top[key], x.max().double())
        device_min = torch.minimum(device_min, dv.min().double())
        for key, x in (("dot_db", fd * fb), ("dot_dd", fd * fd), ("dot_bb", fb * fb), ("sum_rel", rl),
                       ("sum_sq", kept * kept)):
            sums[key] = sums[key] + x.sum(dtype=torch.float64)
        flags = [rel < dual[0], rel < dual[1], rel < dual[2], sm, sm & (ae > atol), nm, nm & (rel > rtol), dv > bv,
                 dv < bv, ~fin]
        if limits.binary:
            flags.append(bs != dv)
        if limits.ulp is not None:
            mb, emin, thr = limits.ulp
            ul = _ulp_errors(bs, dv, mb, emin)
            top["max_ulp"] = torch.maximum(top["max_ulp"], ul.max().double())
            sums["sum_ulp"] = sums["sum_ulp"] + ul.sum(dtype=torch.float64)
            flags += [zero.bool()] * (11 - len(flags)) + [ul > scalar(thr)]
        counts[:len(flags)] += torch.stack([x.sum() for x in flags])
    # what comes back: the totals (one copy each), then the largest errors of the chunks
    got = dict(zip((*top, "device_min", *sums), torch.stack([*top.values(), device_min, *sums.values()]).tolist()))
    ints = dict(zip(_I, counts.tolist()))
    if ints["n_nonfinite"]:  # a non-finite element: the host's careful path
        return None
    first = int(torch.argmax(torch.stack([e for e, _ in worst])))  # the first chunk holding the largest error
    ulp = limits.ulp is not None
    return stats.MetricStats(
        n=n, max_abs_err=got["max_abs_err"], worst=int(worst[first][1]), bench_absmax=got["bench_absmax"],
        device_max=got["device_max"], device_min=got["device_min"], dot_db=got["dot_db"], dot_dd=got["dot_dd"],
        dot_bb=got["dot_bb"], rel_below=dict(zip(limits.dual, (ints["lt0"], ints["lt1"], ints["lt2"]))),
        n_small=ints["n_small"], n_small_over=ints["n_small_over"], n_normal=ints["n_normal"],
        n_normal_over=ints["n_normal_over"], max_rel_normal=got["max_rel_normal"], sum_rel_normal=got["sum_rel"],
        pairwise_rel_normal=got["sum_rel"], sum_sq_normal=got["sum_sq"], n_up=ints["n_up"], n_down=ints["n_down"],
        n_nonfinite=0, n_differ=ints["n_differ"] if limits.binary else None,
        max_ulp=got["max_ulp"] if ulp else None, sum_ulp=got["sum_ulp"] if ulp else None,
        n_ulp_over=ints["n_ulp_over"] if ulp else None)
