"""The `strict` standard (the default): what a correct kernel in the device dtype may lose, per kind of op.

Errors are measured against the bench in units of the device dtype: an output equal to the bench
correctly rounded to that dtype has zero error, so bf16, fp16 and fp32 are judged on the same footing.
The error scale of each element is one ULP of the rounded bench, raised to what a correct kernel may
lose there, by the op's kind (`api_specs/error_model.yaml`):

* elementwise (the default): exact inputs, so the output's own ULPs, or the error of torch's own
  kernel at that element (the *torch run*: the API on CPU in the device dtype) where torch loses more;
* exact (IEEE add, mul, div, sqrt, ...): as elementwise, and every element must be the correctly
  rounded result or torch's own;
* reduction (softmax, norms, losses, pooling, attention, sums): also the root mean square of the torch
  run's errors over the element's row (last dimension), so that a cancelled element is judged against
  the size of the terms of its row, not its own tiny ULPs (flash-style rounding of attention
  probabilities, another summation order);
* contraction (linear, matmul, conv, einsum): the size of the terms that produced the element (the
  *magnitude run*: the API on the absolute values of its inputs) times fp32 accumulation's unit
  roundoff: fp32 accumulation in any order or split passes, 16-bit accumulation fails.

Then four checks, all numbers in api_specs/thresholds.yaml (`strict:`):
1. NaN and inf sit where the rounded bench (or the torch run) has them, with the same signs.
2. No element is grossly wrong: normalised error <= gross.
3. The typical error is not larger than the torch run's: mean <= mean_ref_factor * its mean + slack.
4. The errors are not biased (in one direction, or towards zero as truncation is): a t-test over rows
   of the signed errors (in ULPs, clipped to +-1), significant and larger than the torch run's bias.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

# mantissa bits and smallest normal exponent of each device dtype
_FORMATS = {
    "torch.float16": (10, -14),
    "torch.bfloat16": (7, -126),
    "torch.float32": (23, -126),
    "torch.float64": (52, -1022),
}
KINDS = ("elementwise", "exact", "reduction", "contraction")


@dataclass
class StrictResult:
    status: str  # "pass" | "error"
    message: str
    stats: dict[str, float]


def supported(device_dtype: str) -> bool:
    return device_dtype in _FORMATS


def round_to(values: np.ndarray, device_dtype: str) -> np.ndarray:
    """Round (float64) values to the device dtype, returned as float64; bf16 via fp32, as a kernel would."""
    if device_dtype == "torch.float16":
        return values.astype(np.float16).astype(np.float64)
    if device_dtype == "torch.float32":
        return values.astype(np.float32).astype(np.float64)
    if device_dtype == "torch.bfloat16":
        bits = values.astype(np.float32).view(np.uint32)
        finite = np.isfinite(values)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        out = np.where(finite, rounded, bits).view(np.float32)
        return out.astype(np.float64)
    return values.astype(np.float64)


def ulp(values: np.ndarray, device_dtype: str) -> np.ndarray:
    """Spacing of the device dtype at |values| (the subnormal spacing below the normal range).

    From the float64 exponent bits (every fp16/bf16/fp32 value is a normal float64); 0 counts as
    the smallest normal binade.
    """
    mantissa, emin = _FORMATS[device_dtype]
    a = np.abs(np.asarray(values, dtype=np.float64))
    binade = (a.view(np.uint64) & np.uint64(0x7FF0000000000000)).view(np.float64)  # 2**floor(log2|v|)
    return np.maximum(binade, 2.0 ** emin) * 2.0 ** -mantissa


def accumulation_roundoff(device_dtype: str) -> float:
    """Unit roundoff of the accumulator a correct kernel uses: fp32 up to fp32 outputs, else fp64."""
    return 2.0 ** -53 if device_dtype == "torch.float64" else 2.0 ** -24


def _nonfinite_mismatch(values: np.ndarray, rounded: np.ndarray) -> np.ndarray:
    nan_v, nan_b = np.isnan(values), np.isnan(rounded)
    inf_v, inf_b = np.isinf(values), np.isinf(rounded)
    return (nan_v != nan_b) | (inf_v != inf_b) | (inf_v & inf_b & (np.sign(values) != np.sign(rounded)))


def _groups(n: int, row: int, min_size: int) -> int:
    """Elements per group: whole rows (the last dimension), merged until a group has min_size elements."""
    row = max(1, min(row, n))
    size = row * -(-min_size // row) if row < min_size else row
    return min(size, n)


def _grouped(values: np.ndarray, size: int) -> np.ndarray:
    """values as (groups, size), the last partial group padded with NaN (nan-aware reductions skip it)."""
    pad = -values.size % size
    if pad:
        values = np.concatenate([values, np.full(pad, np.nan)])
    return values.reshape(-1, size)


def _row_rms(errors: np.ndarray, size: int) -> np.ndarray:
    grouped = _grouped(errors, size)
    rms = np.sqrt(np.nanmean(grouped * grouped, axis=1))
    return np.repeat(rms, size)[: errors.size]


def _t_statistic(signed: np.ndarray, size: int, min_groups: int) -> tuple[float, float]:
    """(mean, t) of signed errors, the t-test over group means: rounding errors shared within a row
    (one normalisation factor per softmax row) are one observation, not a row's worth."""
    if size * min_groups > signed.size:
        size = max(1, signed.size // min_groups)
    means = np.nanmean(_grouped(signed, size), axis=1)
    mean = float(np.mean(means))
    spread = float(np.std(means, ddof=1)) if means.size > 1 else 0.0
    if spread == 0.0:
        return mean, (0.0 if mean == 0.0 else float(np.copysign(np.inf, mean)))
    return mean, float(mean / (spread / np.sqrt(means.size)))


def strict_compare(bench: np.ndarray, device: np.ndarray, device_dtype: str, rules: Mapping[str, Any], *,
                   kind: str = "elementwise", torch_run: np.ndarray | None = None,
                   magnitude: np.ndarray | None = None, product: np.ndarray | None = None,
                   row: int = 1) -> StrictResult:
    """Judge one float output (all arrays of one shape, any float dtype; `device` and `torch_run` hold
    values of the device dtype). `row` is the length of the last dimension. `product` is a contraction's
    result before its bias was added, whose own rounding a sound kernel may keep.

    Without a torch run the ideal kernel (the bench correctly rounded) stands in for it.
    """
    b = np.asarray(bench, dtype=np.float64).reshape(-1)
    d = np.asarray(device, dtype=np.float64).reshape(-1)
    n = d.size
    stats: dict[str, float] = {"nonfinite_mismatch": 0.0}
    with np.errstate(all="ignore"):
        rounded = round_to(b, device_dtype)
        t = rounded if torch_run is None else np.asarray(torch_run, dtype=np.float64).reshape(-1)
        finite = np.isfinite(d) & np.isfinite(rounded) & np.isfinite(t) & np.isfinite(b)
        if not finite.all():
            bad_dev, bad_ref = _nonfinite_mismatch(d, rounded), _nonfinite_mismatch(t, rounded)
            # a position where torch's own kernel shows the very same non-finite value is inherent
            mismatch = bad_dev & ~(bad_ref & ((d == t) | (np.isnan(d) & np.isnan(t))))
            if mismatch.any():
                first = int(np.flatnonzero(mismatch)[0])
                stats["nonfinite_mismatch"] = float(np.count_nonzero(mismatch))
                return StrictResult("error", f"NaN/inf mismatch at {int(stats['nonfinite_mismatch'])} of {n} elements "
                                             f"(first at flat index {first}: device {float(d[first])!r}, "
                                             f"bench {float(rounded[first])!r})", stats)
            b, d, t, rounded = b[finite], d[finite], t[finite], rounded[finite]
            magnitude = None if magnitude is None else np.asarray(magnitude, dtype=np.float64).reshape(-1)[finite]
            product = None if product is None else np.asarray(product, dtype=np.float64).reshape(-1)[finite]
            row = 1  # rows lose their meaning once non-finite elements are dropped
        m = b.size
        if not m:
            return StrictResult("pass", "no finite elements; non-finite positions match", stats)
        unit = ulp(rounded, device_dtype)
        scale = unit
        err_t = np.abs(t - b)
        if torch_run is not None:
            scale = np.maximum(scale, rules["torch_factor"] * err_t)
            if kind == "reduction":
                scale = np.maximum(scale, rules["row_factor"] * _row_rms(err_t, _groups(m, row, rules["row_min"])))
        if magnitude is not None:
            mag = np.abs(np.asarray(magnitude, dtype=np.float64).reshape(-1))
            scale = np.maximum(scale, rules["accumulation_factor"] * accumulation_roundoff(device_dtype) * mag)
        if product is not None:
            scale = np.maximum(scale, ulp(np.asarray(product, dtype=np.float64).reshape(-1), device_dtype))
        w = np.where(d == rounded, 0.0, np.abs(d - b) / scale)
        w_t = np.where(t == rounded, 0.0, err_t / scale)
        worst = int(np.argmax(w))
        stats.update(max_err=float(w[worst]), mean_err=float(w.mean()), ref_max_err=float(w_t.max()),
                     ref_mean_err=float(w_t.mean()))
        problems = []
        if kind == "exact":
            wrong = (d != rounded) & (d != t)
            if wrong.any():
                first = int(np.flatnonzero(wrong)[0])
                problems.append(f"not correctly rounded: {int(np.count_nonzero(wrong))} of {m} elements differ from "
                                f"the correctly rounded result and from torch's (first: device {float(d[first])!r}, "
                                f"correctly rounded {float(rounded[first])!r})")
        gross_limit = float(rules["gross"])
        gross = int(np.count_nonzero(w > gross_limit))
        if gross:
            index = worst if finite.all() else int(np.flatnonzero(finite)[worst])
            problems.append(f"gross error: {gross} of {m} elements exceed {gross_limit:.3g} (worst {w[worst]:.3g} "
                            f"at flat index {index}: device {float(d[worst])!r}, bench {float(b[worst])!r}, "
                            f"{abs(d[worst] - b[worst]) / unit[worst]:.3g} ULP)")
        if m >= rules["min_elements"]:
            mean_limit = rules["mean_ref_factor"] * stats["ref_mean_err"] + rules["mean_slack"]
            if stats["mean_err"] > mean_limit:
                problems.append(f"mean error: {stats['mean_err']:.3g} > limit {mean_limit:.3g} (torch run: "
                                f"{stats['ref_mean_err']:.3g})")
            problems += _bias(b, d, t, unit, rules, _groups(m, row, rules["row_min"]), stats)
    if problems:
        return StrictResult("error", "; ".join(problems), stats)
    return StrictResult("pass", "", stats)


def _bias(b: np.ndarray, d: np.ndarray, t: np.ndarray, unit: np.ndarray, rules: Mapping[str, Any], size: int,
          stats: dict[str, float]) -> list[str]:
    """Systematic shifts: each element's signed error in ULPs, clipped to +-1 so that the few large errors
    of cancelled elements cannot mask (or fake) a half-ULP shift such as truncation."""
    problems = []
    towards_zero = -np.sign(b)
    min_groups = int(rules["bias_min_groups"])
    for key, what, sign in (("bias", "biased in one direction", 1.0), ("bias_zero", "biased towards zero", towards_zero)):
        mean, t_dev = _t_statistic(np.clip((d - b) / unit, -1.0, 1.0) * sign, size, min_groups)
        ref_mean, t_ref = _t_statistic(np.clip((t - b) / unit, -1.0, 1.0) * sign, size, min_groups)
        stats[key], stats[f"{key}_t"], stats[f"ref_{key}"], stats[f"ref_{key}_t"] = mean, t_dev, ref_mean, t_ref
        t_limit = max(float(rules["bias_t"]), rules["bias_ref_factor"] * abs(t_ref))
        size_limit = rules["bias_min_ulp"] + abs(ref_mean)
        if abs(t_dev) > t_limit and abs(mean) > size_limit:
            problems.append(f"bias: errors {what}, mean signed error {mean:.3g} ULP > limit {size_limit:.3g} "
                            f"(torch run {ref_mean:.3g}), t-statistic {abs(t_dev):.3g} > {t_limit:.3g}")
    return problems
