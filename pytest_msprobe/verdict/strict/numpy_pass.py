"""The strict pass's numpy backend: block by block in numpy, as the pass was before the compiled kernel. The plugin
never chooses it (backends.HOST is numba): it is the reference that tests/test_strict_kernel.py holds the numba and
streamed backends to, the same arrays giving the same totals bit for bit.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...metrics.storage import widen
from ..grid import FORMATS, accumulation_roundoff, filled, round_to, ulp, work_dtype
from .rules import ROW_KINDS, Totals, plan


@dataclass
class _Pass:
    """What every block of one output's pass reads, and the totals it adds to."""
    flat: dict[str, np.ndarray]
    device_dtype: str
    rules: Mapping[str, Any]
    kind: str
    floor: float
    acc: Totals


def judge_blocks(flat: dict[str, np.ndarray], row: int, device_dtype: str, rules: Mapping[str, Any],
                 kind: str) -> Totals:
    """The totals of every block of whole rows, in numpy; a bf16 output's storage as its values
    (metrics/storage.py)."""
    flat = {k: widen(v) for k, v in flat.items()}
    m = flat["d"].size
    size, block, every, floor = plan(flat, row, rules, kind)
    pass_ = _Pass(flat, device_dtype, rules, kind, floor, Totals())
    layout = _layout(block, size)
    for i, start in enumerate(range(0, m, block)):
        stop = min(start + block, m)
        _block(pass_, slice(start, stop), layout if stop - start == block else _layout(stop - start, size),
               i % every == 0)
    return pass_.acc


def _unflushed(values: np.ndarray, bench: np.ndarray, rounded: np.ndarray, device_dtype: str) -> np.ndarray:
    """`values` with each zero where the bench lies below the device dtype's normal range replaced by the
    correctly rounded bench: a kernel that flushes such a result to zero (either sign; flush-to-zero, as
    NPUs, GPUs and CPUs' 16-bit dot products do) has not erred. Only the one pass over `values` when it
    holds no zero."""
    zero = values == 0
    if not zero.any():
        return values
    flushed = zero & (np.abs(bench) < 2.0 ** FORMATS[device_dtype][1])
    return np.where(flushed, rounded, values) if flushed.any() else values


def _layout(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(first element, element count) of each group of `size` elements in a block of `n`."""
    starts = np.arange(0, n, size)
    return starts, np.diff(np.append(starts, n))


def _block(pass_: _Pass, s: slice, layout: tuple[np.ndarray, np.ndarray], bias: bool) -> None:
    """One block of whole groups: normalised errors, gross and wrongly rounded elements, group sums."""
    flat, device_dtype, rules, kind, acc, floor = (pass_.flat, pass_.device_dtype, pass_.rules, pass_.kind,
                                                   pass_.acc, pass_.floor)
    work = work_dtype(device_dtype)
    b = flat["b"][s].astype(work, copy=False)
    d = flat["d"][s].astype(work, copy=False)
    rounded = round_to(b, device_dtype, all_finite=True, work=work)
    d = _unflushed(d, b, rounded, device_dtype)
    has_t = "t" in flat
    t = _unflushed(flat["t"][s].astype(work, copy=False), b, rounded, device_dtype) if has_t else rounded
    unit = ulp(rounded, device_dtype)
    scale = np.maximum(unit, filled(floor, unit.size, unit.dtype)) if floor else unit
    starts, counts = layout
    if has_t:
        err_t = np.abs(t - b)
        scale = np.maximum(scale, work(rules["torch_factor"]) * err_t)
        if kind in ROW_KINDS:  # a contraction with a torch run: another summation order
            rms = np.repeat(np.sqrt(np.add.reduceat(np.square(err_t, dtype=np.float64), starts) / counts), counts)
            scale = np.maximum(scale, (rules["row_factor"] * rms).astype(work))
            if "est" in flat:
                scale = np.where(flat["est"][s], np.maximum(scale, (rules["estimated_row_factor"] * rms).astype(work)),
                                 scale)
    if "mag" in flat:
        mag = np.abs(flat["mag"][s].astype(work, copy=False))
        scale = np.maximum(scale, work(rules["accumulation_factor"] * accumulation_roundoff(device_dtype)) * mag)
    if "prod" in flat:
        scale = np.maximum(scale, ulp(flat["prod"][s].astype(work, copy=False), device_dtype))
    diff = d - b
    # the errors are finite here, so multiplying by "not correctly rounded" zeroes the others (3-7x
    # faster than np.where)
    w = np.abs(diff)
    w /= scale
    w *= d != rounded
    worst = int(np.argmax(w))
    if w[worst] > acc.max_w:
        acc.max_w, acc.worst = float(w[worst]), s.start + worst
    acc.sum_w += float(w.sum(dtype=np.float64))
    if has_t:  # without a torch run the ideal kernel (`rounded`) stands in: zero error
        w_t = err_t / scale
        w_t *= t != rounded
        acc.sum_t += float(w_t.sum(dtype=np.float64))
        acc.max_t = max(acc.max_t, float(w_t.max()))
    acc.gross += int(np.count_nonzero(w > rules["gross"]))
    if kind == "exact":
        wrong = (d != rounded) & (d != t) if has_t else d != rounded
        if wrong.any():
            if acc.first_wrong < 0:
                acc.first_wrong = s.start + int(np.argmax(wrong))
            acc.wrong += int(np.count_nonzero(wrong))
            acc.wrong_zero += int(np.count_nonzero(wrong & (np.abs(d) < np.abs(rounded))))
            acc.wrong_up += int(np.count_nonzero(wrong & (d > rounded)))
            mantissa = FORMATS[device_dtype][0]
            window = rules["exact_tie_factor"] * 2.0 ** (mantissa - 24)  # an fp32 scalar's rounding, in ULPs
            off_tie = np.abs(np.abs(b - rounded) / unit - 0.5) > window
            acc.wrong_off_tie += int(np.count_nonzero(wrong & off_tie))
    if not bias:
        return
    # signed errors in ULPs from the correctly rounded result (which has none: its own rounding of repeated
    # values is no bias), each clipped to +-1 so that the few large errors of cancelled elements cannot
    # mask (or fake) a systematic half-ULP shift such as truncation
    signed_d = np.clip((d - rounded) / unit, -1.0, 1.0)
    signed_t = np.clip((t - rounded) / unit, -1.0, 1.0)
    towards_zero = -np.sign(b)
    acc.bias["bias"].append(np.add.reduceat(signed_d, starts, dtype=np.float64))
    acc.bias["ref_bias"].append(np.add.reduceat(signed_t, starts, dtype=np.float64))
    acc.bias["bias_zero"].append(np.add.reduceat(signed_d * towards_zero, starts, dtype=np.float64))
    acc.bias["ref_bias_zero"].append(np.add.reduceat(signed_t * towards_zero, starts, dtype=np.float64))
    acc.counts.append(counts)
