"""The `strict` standard: representation-aware, conditioning-aware, bias- and outlier-sensitive.

Errors are measured against the fp64 bench in units of the device dtype: an output equal to the
bench correctly rounded to that dtype has zero error, so bf16, fp16 and fp32 are judged on the same
footing. What a correct kernel may lose beyond rounding (long reductions, cancellation) is learnt
from a reference run of the same call: the reference device when one is given, else the API on
CPU computing in fp32 (fp64 for fp64) with the result rounded to the device dtype. Four checks:

1. NaN and inf sit at the same positions (with the same signs) as in the rounded bench.
2. No element is grossly wrong: normalised error <= max(gross_ulp, gross_ref_factor * worst ref error).
3. The typical error is not much larger than the reference's: mean <= mean_ref_factor * ref mean + slack.
4. The errors are not biased (absolutely, or towards zero as truncation is): a bias must be both
   significant (sign-balance z-score over bias_z) and large (mean signed error over bias_min_ulp
   beyond the reference's own) to fail.

Numbers live in api_specs/thresholds.yaml (`strict:`); REFERENCE of the rules: README "strict".
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
    """Spacing of the device dtype at |values| (the subnormal spacing below the normal range)."""
    mantissa, emin = _FORMATS[device_dtype]
    _, exponent = np.frexp(np.abs(values))
    return np.ldexp(1.0, np.maximum(exponent - 1, emin) - mantissa)


def _nonfinite_mismatch(device: np.ndarray, rounded: np.ndarray) -> np.ndarray:
    nan_d, nan_b = np.isnan(device), np.isnan(rounded)
    inf_d, inf_b = np.isinf(device), np.isinf(rounded)
    return (nan_d != nan_b) | (inf_d != inf_b) | (inf_d & inf_b & (np.sign(device) != np.sign(rounded)))


def _distinct(bench: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Indices of distinct (bench, other) pairs: low-precision inputs repeat values, and one rounding
    error repeated a thousand times is one observation, not a thousand."""
    keys = bench.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ other.view(np.uint64)
    return np.unique(keys, return_index=True)[1]


def _balance(diff: np.ndarray) -> float:
    """z-score of the sign balance of non-zero errors (|#up - #down| / sqrt(n))."""
    up, down = int(np.count_nonzero(diff > 0)), int(np.count_nonzero(diff < 0))
    n = up + down
    return float(abs(up - down) / np.sqrt(n)) if n else 0.0  # a Python float: records cross xdist (execnet)


def _signed_mean(errors: np.ndarray, unit: np.ndarray) -> float:
    return float(np.mean(np.clip(errors / unit, -1.0, 1.0)))


def _normalised(errors: np.ndarray, scale: np.ndarray, exact: np.ndarray) -> np.ndarray:
    return np.where(exact, 0.0, errors / scale)


def strict_compare(bench: np.ndarray, device: np.ndarray, reference: np.ndarray, device_dtype: str,
                   rules: Mapping[str, Any], sensitivity: np.ndarray | None = None) -> StrictResult:
    """Judge one float output. All arrays hold the same elements; device/reference in the device dtype's values.

    `sensitivity` is how much the reference kernel's (unrounded) output moves, per element, when its
    inputs move by one unit roundoff of the device dtype: what a backward-stable kernel in that dtype
    may lose (cancellation, long reductions, intermediates rounded to the storage dtype).
    """
    b = np.asarray(bench, dtype=np.float64).reshape(-1)
    d = np.asarray(device, dtype=np.float64).reshape(-1)
    r = np.asarray(reference, dtype=np.float64).reshape(-1)
    sens = None if sensitivity is None else np.asarray(sensitivity, dtype=np.float64).reshape(-1)
    with np.errstate(all="ignore"):
        rounded = round_to(b, device_dtype)
        bad_dev = _nonfinite_mismatch(d, rounded)
        bad_ref = _nonfinite_mismatch(r, rounded)
        # a position where the reference kernel shows the very same non-finite value is inherent, not a bug
        same_as_ref = bad_dev & bad_ref & ((d == r) | (np.isnan(d) & np.isnan(r)))
        mismatch = bad_dev & ~same_as_ref
        stats: dict[str, float] = {"nonfinite_mismatch": float(np.count_nonzero(mismatch))}
        if mismatch.any():
            first = int(np.flatnonzero(mismatch)[0])
            return StrictResult("error", f"NaN/inf mismatch at {int(mismatch.sum())} of {d.size} elements "
                                         f"(first at flat index {first}: device {d[first]!r}, bench {rounded[first]!r})",
                                stats)
        finite = np.isfinite(d) & np.isfinite(rounded) & np.isfinite(r) & np.isfinite(b)
        if not finite.any():
            return StrictResult("pass", "no finite elements; non-finite positions match", stats)
        b, d, r, rounded = b[finite], d[finite], r[finite], rounded[finite]
        err_d, err_r = np.abs(d - b), np.abs(r - b)
        unit = ulp(rounded, device_dtype)
        # Error scale: one ULP, raised to what a correct kernel may lose beyond rounding: the reference's
        # typical excess error (long reductions) and, per element, the output's sensitivity to input
        # perturbations of one unit roundoff (cancellation). Small elements of well-conditioned ops stay
        # judged in their own ULPs.
        floor = float(np.quantile(np.maximum(err_r - unit, 0.0), rules["noise_quantile"]))
        scale = np.maximum(unit, floor)
        if sens is not None:
            scale = np.maximum(scale, rules["sensitivity_factor"] * np.nan_to_num(sens[finite], posinf=0.0))
        w = _normalised(err_d, scale, d == rounded)
        wr = _normalised(err_r, scale, r == rounded)
        stats.update(max_err=float(w.max()), mean_err=float(w.mean()), ref_max_err=float(wr.max()),
                     ref_mean_err=float(wr.mean()), noise_floor=floor)
        # Bias statistics on at most bias_max_samples evenly spaced elements: plenty for a sign test.
        if b.size > rules["bias_max_samples"]:
            pick = np.linspace(0, b.size - 1, int(rules["bias_max_samples"])).astype(np.int64)
            b, d, r, unit = b[pick], d[pick], r[pick], unit[pick]
        towards_zero = -np.sign(b)
        for side, values in (("", d), ("ref_", r)):
            error = values - b
            distinct = _distinct(b, values)
            stats[f"{side}bias_z"] = _balance(error[distinct])
            stats[f"{side}bias_zero_z"] = _balance((error * towards_zero)[distinct])
            # mean signed error in ULPs, each element clipped to +-1 ULP so that the few large errors of
            # cancelling elements cannot mask (or fake) a systematic half-ULP shift such as truncation
            stats[f"{side}bias"] = _signed_mean(error, unit)
            stats[f"{side}bias_zero"] = _signed_mean(error * towards_zero, unit)
    problems = []
    gross_limit = max(rules["gross_ulp"], rules["gross_ref_factor"] * stats["ref_max_err"])
    gross = w > gross_limit
    if gross.any():
        worst = int(np.argmax(w))
        problems.append(f"{int(gross.sum())} of {w.size} elements exceed {gross_limit:.3g} ULP "
                        f"(worst {stats['max_err']:.3g} ULP: device {d[worst]!r}, bench {b[worst]!r})")
    mean_limit = rules["mean_ref_factor"] * stats["ref_mean_err"] + rules["mean_slack_ulp"]
    if w.size >= rules["mean_min_elements"] and stats["mean_err"] > mean_limit:  # a mean of few elements is noise
        problems.append(f"mean error {stats['mean_err']:.3g} ULP > {mean_limit:.3g} "
                        f"(reference kernel: {stats['ref_mean_err']:.3g} ULP)")
    for key, what in (("bias", "biased in one direction"), ("bias_zero", "biased towards or away from zero")):
        # significant (z-score) AND large enough (mean signed error) to be a kernel's bias, not
        # correlated rounding (e.g. one normalisation factor shared by a whole softmax row)
        z_limit = max(rules["bias_z"], rules["bias_ref_factor"] * stats[f"ref_{key}_z"])
        size_limit = rules["bias_min_ulp"] + abs(stats[f"ref_{key}"])
        if stats[f"{key}_z"] > z_limit and abs(stats[key]) > size_limit:
            problems.append(f"errors {what}: mean signed error {stats[key]:.3g} ULP (reference "
                            f"{stats[f'ref_{key}']:.3g}), sign-balance z-score {stats[f'{key}_z']:.3g} > {z_limit:.3g}")
    if problems:
        return StrictResult("error", "; ".join(problems), stats)
    return StrictResult("pass", "", stats)
