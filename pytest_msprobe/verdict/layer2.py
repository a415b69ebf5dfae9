"""msprobe's Layer-2 algorithms (REFERENCE-msprobe.md §4.2, §4.4): which one an output gets, the limits its
statistics are counted against, and its metric columns. The Layer-1 verdict (verdict/standards.py) is the same
for every output; these differ by API and dtype, and the new standard's decisions (verdict/verdicts.py) and the
compare command (reports/compare.py) read them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..metrics import stats
from ..metrics import vectorised as M
from ..specs.loader import per_dtype

_INDEX: dict[int, tuple[Mapping[str, Any], dict[str, str]]] = {}


def algorithm_for(api_name: str, device_dtype: str, categories: Mapping[str, Any], standard: str = "msprobe",
                  override: str | None = None) -> str:
    """8.x category selection: non-float dtype -> binary_consistency; else the first list in
    `lookup_order` holding the bare API name; else `default` (benchmark). Under `msprobe26` every float
    output is benchmark, as 26.x's code does. Accepts the categories mapping or a whole specs mapping."""
    cats = categories["categories"] if "categories" in categories else categories
    if device_dtype not in cats["float_dtypes"]:
        return "binary_consistency"
    if override:  # a user's spec file put this API in a category
        return override
    if standard == "msprobe26":
        return "benchmark"
    cached = _INDEX.get(id(cats))
    if cached is None or cached[0] is not cats:
        index: dict[str, str] = {}
        for algo in cats["lookup_order"]:
            for name in cats.get(algo) or ():
                index.setdefault(name, algo)
        cached = _INDEX[id(cats)] = (cats, index)
    default: str = cats.get("default", "benchmark")
    return cached[1].get(api_name, default)


def limits(algo: str | None, dtype: str, eps: float, th: Mapping[str, Any]) -> stats.Limits:
    """The thresholds the statistics of `algo`'s columns are counted against."""
    t = th["layer1"]["dual_ratio"]
    dual = (float(t["hundredth"]), float(t["thousandth"]), float(t["ten_thousandth"]))
    small = atol = rtol = 0.0
    if algo == "benchmark":
        small, atol = per_dtype(th["small_value"], dtype), per_dtype(th["small_value_atol"]["benchmark"], dtype)
    elif algo == "absolute_threshold":
        small, rtol = per_dtype(th["small_value"], dtype), per_dtype(th["rtol"], dtype)
        atol = per_dtype(th["small_value_atol"]["absolute_threshold"], dtype)
    elif algo == "accumulative_error_compare":
        small, atol = th["accumulative_error"]["small_value"], per_dtype(th["accumulative_error"]["bound"], dtype)
        rtol = atol
    ulp = None
    if algo == "ulp_compare":
        p = th["ulp"][dtype]
        ulp = (int(p["mantissa_bits"]), int(p["min_exponent"]), float(p["elem_threshold"]))
    return stats.Limits(eps, float(small), float(atol), float(rtol), dual, ulp, algo == "binary_consistency")


@dataclass(frozen=True)
class Plan:
    """How one float output is measured (standards.metric_plan decides it): its torch dtype string, the numpy
    dtype of its device values (`dev_dtype`: float32 for bf16) and the error dtype `work`, the API's thresholds,
    its Layer-2 algorithm (None outside layer2_dtypes), the limits its statistics are counted against, and the
    metric standard."""
    dtype: str
    dev_dtype: np.dtype[Any]
    work: np.dtype[Any]
    th: Mapping[str, Any]
    algo: str | None
    limits: stats.Limits
    standard: str


def columns(plan: Plan, b: np.ndarray, d: np.ndarray, err: M.ErrorArrays) -> dict[str, float]:
    """The metric columns of the one Layer-2 algorithm chosen for this output (§4.2). `d` may be wider than
    the device's numpy dtype `plan.dev_dtype` (fp16 held as fp32)."""
    algo, dev_dtype, dtype, th = plan.algo, plan.dev_dtype, plan.dtype, plan.th
    if algo == "binary_consistency":
        return {"binary_error_rate": M.binary_error_rate(b, d)}
    if algo == "thousandth_threshold":
        return {"dual_thousandth": M.dual_ratio(err.rel_err, th["layer1"]["dual_ratio"]["thousandth"])[0]}
    if algo == "ulp_compare":
        p = th["ulp"][dtype]
        ulp = M.ulp_errors(b, d, err.abs_bench, mantissa_bits=p["mantissa_bits"], min_exponent=p["min_exponent"],
                           compute_dtype=p["compute_dtype"])
        return M.ulp_metrics(ulp, p["elem_threshold"])
    both_finite, bench_dev = M.finite_mask(b, d, dev_dtype)
    sides = M.Sides(d, bench_dev, both_finite, dev_dtype)
    if algo == "benchmark":
        fudge = th["rmse_fudge"]
        return M.benchmark_metrics(err, sides, small_value=per_dtype(th["small_value"], dtype),
                                   atol=per_dtype(th["small_value_atol"]["benchmark"], dtype),
                                   rmse_fudge=(fudge["denominator_eps"], fudge["additive"]))
    clip = th["inf_nan_clip_range"].get(dtype)
    if clip is None:
        info = np.finfo(dev_dtype)
        clip = (info.min, info.max)
    if algo == "absolute_threshold":
        return M.absolute_threshold_metrics(
            err, sides, rtol=per_dtype(th["rtol"], dtype), clip_range=tuple(clip),
            small_value=per_dtype(th["small_value"], dtype),
            atol=per_dtype(th["small_value_atol"]["absolute_threshold"], dtype))
    if algo == "accumulative_error_compare":
        acc = th["accumulative_error"]
        bound = per_dtype(acc["bound"], dtype)
        out = M.absolute_threshold_metrics(err, sides, rtol=bound, small_value=acc["small_value"], atol=bound,
                                           clip_range=tuple(clip))
        out["error_balance"] = M.error_balance(d, bench_dev)
        return out
    raise ValueError(f"unknown precision algorithm {algo!r}")


def other_columns(b: np.ndarray, d: np.ndarray, device_dtype: str, th: Mapping[str, Any],
                  standard: str) -> tuple[str | None, dict[str, float], list[str]]:
    """(algorithm, columns, messages) of a float output outside layer2_dtypes: 26.x's fp8 ULP rule, else a
    message."""
    if standard == "msprobe26" and device_dtype in th["ulp_fp8_26x"]["dtypes"]:  # 26.x: fp8 -> its ULP rule
        p = th["ulp_fp8_26x"]
        return "ulp_compare", M.ulp_metrics(M.ulp_errors_fp8(b, d, exponent_floor=p["exponent_floor"],
                                                              mantissa_width=p["mantissa_width"]),
                                             p["elem_threshold"]), []
    return None, {}, [f"The data type {device_dtype} is not supported for new precision standard."]
