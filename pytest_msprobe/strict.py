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
from typing import Any, Iterator, Mapping

import numpy as np

# mantissa bits and smallest normal exponent of each device dtype
_FORMATS = {
    "torch.float16": (10, -14),
    "torch.bfloat16": (7, -126),
    "torch.float32": (23, -126),
    "torch.float64": (52, -1022),
}
BLOCK = 1 << 15  # elements per block of the element-wise passes (a float64 block is 256 KiB)


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
    the binade [0.5, 1), as frexp has it.
    """
    mantissa, emin = _FORMATS[device_dtype]
    a = np.abs(np.asarray(values, dtype=np.float64))
    binade = (a.view(np.uint64) & np.uint64(0x7FF0000000000000)).view(np.float64)  # 2**floor(log2|v|)
    binade[a == 0] = 0.5
    return np.maximum(binade, 2.0 ** emin) * 2.0 ** -mantissa


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


def _blocks(n: int) -> Iterator[slice]:
    return (slice(i, min(i + BLOCK, n)) for i in range(0, n, BLOCK))


def _quantile(positives: list[np.ndarray], zeros: int, q: float) -> float:
    """np.quantile (linear) of `zeros` zeros plus the positive values, partitioning only the positives:
    the reference is usually within one ULP, so most excess errors are zero."""
    m = zeros + sum(p.size for p in positives)
    position = q * (m - 1)
    low = int(np.floor(position))
    high = min(low + 1, m - 1)
    if high < zeros:
        return 0.0
    values = np.concatenate(positives)
    wanted = sorted({i - zeros for i in (low, high) if i >= zeros})
    part = np.partition(values, wanted)
    at = {i: (part[i - zeros] if i >= zeros else 0.0) for i in (low, high)}
    return float(at[low] + (at[high] - at[low]) * (position - low))


def strict_compare(bench: np.ndarray, device: np.ndarray, reference: np.ndarray, device_dtype: str,
                   rules: Mapping[str, Any], sensitivity: np.ndarray | None = None) -> StrictResult:
    """Judge one float output. All arrays hold the same elements (any float dtype); device/reference
    hold values of the device dtype.

    `sensitivity` is how much the reference kernel's (unrounded) output moves, per element, when its
    inputs move by one unit roundoff of the device dtype: what a backward-stable kernel in that dtype
    may lose (cancellation, long reductions, intermediates rounded to the storage dtype).

    The element-wise work runs in blocks of BLOCK elements, converted to float64 block by block, so
    its dozen temporaries stay in cache: two passes over the data (the noise floor is a quantile over
    all elements, needed before any element can be judged) instead of one pass per operation.
    """
    arrays = [np.asarray(x).reshape(-1) for x in (bench, device, reference)]
    sens_all = None if sensitivity is None else np.asarray(sensitivity).reshape(-1)
    n = arrays[1].size

    def block(s: slice) -> tuple[np.ndarray, ...]:
        b, d, r = (np.asarray(x[s], dtype=np.float64) for x in arrays)
        rounded = round_to(b, device_dtype)
        return b, d, r, rounded, np.isfinite(d) & np.isfinite(rounded) & np.isfinite(r) & np.isfinite(b)

    stats: dict[str, float] = {"nonfinite_mismatch": 0.0}
    finite_mask: np.ndarray | None = None  # built only when some element is not finite
    excess: list[np.ndarray] = []  # the reference's errors beyond one ULP, where positive
    finite_count = first = 0
    with np.errstate(all="ignore"):
        for s in _blocks(n):  # pass 1: NaN/inf positions, the reference's excess errors
            b, d, r, rounded, finite = block(s)
            if not finite.all():
                if finite_mask is None:
                    finite_mask = np.ones(n, dtype=bool)
                finite_mask[s] = finite
                bad_dev, bad_ref = _nonfinite_mismatch(d, rounded), _nonfinite_mismatch(r, rounded)
                # a position where the reference kernel shows the very same non-finite value is inherent
                mismatch = bad_dev & ~(bad_ref & ((d == r) | (np.isnan(d) & np.isnan(r))))
                if mismatch.any():
                    if not stats["nonfinite_mismatch"]:
                        first = s.start + int(np.flatnonzero(mismatch)[0])
                    stats["nonfinite_mismatch"] += float(np.count_nonzero(mismatch))
                b, r, rounded = b[finite], r[finite], rounded[finite]
            finite_count += b.size
            e = np.abs(r - b) - ulp(rounded, device_dtype)
            excess.append(e[e > 0])
        if stats["nonfinite_mismatch"]:
            d0, rounded0 = block(slice(first, first + 1))[1:4:2]
            return StrictResult("error", f"NaN/inf mismatch at {int(stats['nonfinite_mismatch'])} of {n} elements "
                                         f"(first at flat index {first}: device {float(d0[0])!r}, "
                                         f"bench {float(rounded0[0])!r})", stats)
        if not finite_count:
            return StrictResult("pass", "no finite elements; non-finite positions match", stats)
        # Error scale: one ULP, raised to what a correct kernel may lose beyond rounding: the reference's
        # typical excess error (long reductions) and, per element, the output's sensitivity to input
        # perturbations of one unit roundoff (cancellation). Small elements of well-conditioned ops stay
        # judged in their own ULPs.
        floor = _quantile(excess, finite_count - sum(e.size for e in excess), rules["noise_quantile"])
        del excess
        w_all = np.zeros(n)  # normalised device errors (0 where not finite)
        sum_w = sum_wr = max_wr = 0.0
        for s in _blocks(n):  # pass 2: normalised errors of device and reference
            b, d, r, rounded, finite = block(s)
            sens = None if sens_all is None else np.asarray(sens_all[s], dtype=np.float64)
            if finite_mask is not None:
                b, d, r, rounded = b[finite], d[finite], r[finite], rounded[finite]
                sens = None if sens is None else sens[finite]
            if not b.size:
                continue
            scale = np.maximum(ulp(rounded, device_dtype), floor)
            if sens is not None:
                scale = np.maximum(scale, rules["sensitivity_factor"] * np.nan_to_num(sens, posinf=0.0))
            w = _normalised(np.abs(d - b), scale, d == rounded)
            wr = _normalised(np.abs(r - b), scale, r == rounded)
            if finite_mask is None:
                w_all[s] = w
            else:
                w_all[s][finite] = w
            sum_w, sum_wr, max_wr = sum_w + float(w.sum()), sum_wr + float(wr.sum()), max(max_wr, float(wr.max()))
        stats.update(max_err=float(w_all.max()), mean_err=sum_w / finite_count, ref_max_err=max_wr,
                     ref_mean_err=sum_wr / finite_count, noise_floor=floor)
        # Bias statistics on at most bias_max_samples evenly spaced finite elements: plenty for a sign test.
        samples = int(rules["bias_max_samples"])
        pick = np.linspace(0, finite_count - 1, samples).astype(np.int64) if finite_count > samples \
            else np.arange(finite_count)
        b, d, r, rounded, _ = block(pick if finite_mask is None else np.flatnonzero(finite_mask)[pick])
        unit = ulp(rounded, device_dtype)
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
    gross = int(np.count_nonzero(w_all > gross_limit))
    if gross:
        worst = int(np.argmax(w_all))
        problems.append(f"{gross} of {finite_count} elements exceed {gross_limit:.3g} ULP "
                        f"(worst {stats['max_err']:.3g} ULP at flat index {worst}: device "
                        f"{float(arrays[1][worst])!r}, bench {float(arrays[0][worst])!r})")
    mean_limit = rules["mean_ref_factor"] * stats["ref_mean_err"] + rules["mean_slack_ulp"]
    if finite_count >= rules["mean_min_elements"] and stats["mean_err"] > mean_limit:  # a mean of few elements is noise
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
