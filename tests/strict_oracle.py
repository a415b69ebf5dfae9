"""The strict checks written the obvious way (whole arrays, frexp, np.quantile): the oracle the
blocked implementation in pytest_msprobe/strict.py must agree with."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from pytest_msprobe.strict import _FORMATS, _balance, _distinct, _nonfinite_mismatch, _signed_mean, round_to


def ulp(values: np.ndarray, device_dtype: str) -> np.ndarray:
    mantissa, emin = _FORMATS[device_dtype]
    _, exponent = np.frexp(np.abs(values))
    return np.ldexp(1.0, np.maximum(exponent - 1, emin) - mantissa)


def strict_stats(bench: np.ndarray, device: np.ndarray, reference: np.ndarray, device_dtype: str,
                 rules: Mapping[str, Any], sensitivity: np.ndarray | None = None) -> tuple[str, dict[str, float]]:
    """(outcome, stats): outcome is "nonfinite", "no finite" or "judged"."""
    b, d, r = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (bench, device, reference))
    sens = None if sensitivity is None else np.asarray(sensitivity, dtype=np.float64).reshape(-1)
    with np.errstate(all="ignore"):
        rounded = round_to(b, device_dtype)
        bad_dev, bad_ref = _nonfinite_mismatch(d, rounded), _nonfinite_mismatch(r, rounded)
        mismatch = bad_dev & ~(bad_dev & bad_ref & ((d == r) | (np.isnan(d) & np.isnan(r))))
        stats = {"nonfinite_mismatch": float(np.count_nonzero(mismatch))}
        if mismatch.any():
            return "nonfinite", stats
        finite = np.isfinite(d) & np.isfinite(rounded) & np.isfinite(r) & np.isfinite(b)
        if not finite.any():
            return "no finite", stats
        b, d, r, rounded = b[finite], d[finite], r[finite], rounded[finite]
        err_d, err_r, unit = np.abs(d - b), np.abs(r - b), ulp(rounded, device_dtype)
        floor = float(np.quantile(np.maximum(err_r - unit, 0.0), rules["noise_quantile"]))
        scale = np.maximum(unit, floor)
        if sens is not None:
            scale = np.maximum(scale, rules["sensitivity_factor"] * np.nan_to_num(sens[finite], posinf=0.0))
        w = np.where(d == rounded, 0.0, err_d / scale)
        wr = np.where(r == rounded, 0.0, err_r / scale)
        stats.update(max_err=float(w.max()), mean_err=float(w.mean()), ref_max_err=float(wr.max()),
                     ref_mean_err=float(wr.mean()), noise_floor=floor)
        if b.size > rules["bias_max_samples"]:
            pick = np.linspace(0, b.size - 1, int(rules["bias_max_samples"])).astype(np.int64)
            b, d, r, unit = b[pick], d[pick], r[pick], unit[pick]
        towards_zero = -np.sign(b)
        for side, values in (("", d), ("ref_", r)):
            error = values - b
            distinct = _distinct(b, values)
            stats[f"{side}bias_z"] = _balance(error[distinct])
            stats[f"{side}bias_zero_z"] = _balance((error * towards_zero)[distinct])
            stats[f"{side}bias"] = _signed_mean(error, unit)
            stats[f"{side}bias_zero"] = _signed_mean(error * towards_zero, unit)
    return "judged", stats
