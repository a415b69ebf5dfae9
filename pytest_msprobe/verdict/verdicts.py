"""msprobe's new precision standard: the per-output decisions of api_precision_compare (REFERENCE §4.3).

Single-run algorithms (absolute threshold, binary consistency, thousandth, accumulative) decide from
the device's own metrics; benchmark and ULP compare the device's error with a reference device's
error against the same bench (ratios floored by min_err). Pure functions over metric dicts.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..specs.loader import per_dtype

PASS, ERROR = "pass", "error"

# api_precision_compare details columns after "API Name", in order, as record keys.
COMPARE_KEYS = (
    "small_value_ratio", "small_value_status", "rmse_ratio", "rmse_status", "max_rel_err_ratio",
    "max_rel_err_status", "mean_rel_err_ratio", "mean_rel_err_status", "eb_ratio", "eb_status",
    "inf_nan_err_ratio", "inf_nan_status", "rel_err_ratio", "rel_err_status", "abs_err_ratio", "abs_err_status",
    "binary_error_rate", "binary_status", "mean_ulp_err", "ulp_err_proportion", "ulp_err_proportion_ratio",
    "ulp_status", "dual_thousandth", "thousandth_status",
)
SINGLE_RUN = ("binary_consistency", "absolute_threshold", "thousandth_threshold", "accumulative_error_compare")
NEEDS_REFERENCE = ("benchmark", "ulp_compare")
# The details-CSV metrics each algorithm reads (api_precision_compare needs them in both files for the
# algorithms of NEEDS_REFERENCE).
INPUT_KEYS = {
    "binary_consistency": ("binary_error_rate",),
    "absolute_threshold": ("inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio"),
    "thousandth_threshold": ("dual_thousandth",),
    "accumulative_error_compare": ("inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio", "error_balance"),
    "benchmark": ("small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err", "error_balance"),
    "ulp_compare": ("mean_ulp_err", "ulp_err_proportion"),
}
# api_precision_compare's hint in the result CSV when an API's forward verdict is error.
API_HINTS = {
    "topk": "在npu上，topk的入参sorted=False时不生效，会返回有序tensor，而cpu上会返回无序tensor。 "
            "如果topk精度不达标，请检查是否是该原因导致的。",
}
# benchmark metric -> (metrics key, msprobe message)
_BENCHMARK = {
    "small_value": ("small_value_err_ratio", "ERROR: 小值域错误比值超过阈值"),
    "rmse": ("rmse", "ERROR: 均方根误差比值超过阈值"),
    "max_rel_err": ("max_rel_err", "ERROR: 相对误差最大值比值超过阈值"),
    "mean_rel_err": ("mean_rel_err", "ERROR: 相对误差平均值比值超过阈值"),
    "eb": ("error_balance", "ERROR: 误差均衡性比值超过阈值"),
}


# The same messages in English, for pages that must read without CJK fonts (the HTML report); the CSVs
# keep msprobe's own words, which its tools and users expect there.
ENGLISH = {
    "ERROR: 小值域错误比值超过阈值": "ERROR: small-value error ratio above the threshold",
    "ERROR: 均方根误差比值超过阈值": "ERROR: RMSE ratio above the threshold",
    "ERROR: 相对误差最大值比值超过阈值": "ERROR: max relative error ratio above the threshold",
    "ERROR: 相对误差平均值比值超过阈值": "ERROR: mean relative error ratio above the threshold",
    "ERROR: 误差均衡性比值超过阈值": "ERROR: error balance ratio above the threshold",
    "ERROR: 二进制一致错误率超过阈值": "ERROR: binary consistency error rate above the threshold",
    "ERROR: 双千指标不达标": "ERROR: fewer than 99.9% of elements within 0.1% relative error",
    "ERROR: inf/nan错误率超过阈值": "ERROR: inf/nan error ratio above the threshold",
    "ERROR: 相对误差错误率超过阈值": "ERROR: relative error ratio above the threshold",
    "ERROR: 绝对误差错误率超过阈值": "ERROR: absolute error ratio above the threshold",
    "ERROR: 误差均衡性超过阈值": "ERROR: error balance above the threshold",
    "ERROR: ULP误差不满足标准": "ERROR: ULP error does not meet the standard",
    API_HINTS["topk"]: "On the NPU topk ignores sorted=False and returns sorted values, while the CPU returns "
                       "them unsorted; if topk fails, check whether that is the reason.",
}


def in_english(text: str) -> str:
    """A verdict message with msprobe's Chinese sentences in English ("; " between the sentences
    msprobe concatenates without a separator)."""
    found = sorted((text.find(zh), zh, en) for zh, en in ENGLISH.items() if zh in text)
    if not found:
        return text
    for _, zh, _ in found:
        text = text.replace(zh, "")
    return "; ".join([en for _, _, en in found] + ([text.strip()] if text.strip() else []))


def _num(value: Any) -> float:
    """A blank metric cell counts as 0.0 (what 26.x does; 8.3.3 crashed on it)."""
    return 0.0 if value is None else float(value)


def needs_reference(algorithm: str, device_dtype: str, th: Mapping[str, Any]) -> bool:
    """Benchmark and ULP compare the device's error with a reference device's, except 26.x's fp8 ULP rule."""
    return algorithm in NEEDS_REFERENCE and not (
        algorithm == "ulp_compare" and device_dtype in th.get("ulp_fp8_26x", {}).get("dtypes", ()))


def single_run(algorithm: str, metrics: Mapping[str, Any], device_dtype: str,
               th: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """Verdict of an algorithm that needs no reference device."""
    cells: dict[str, Any] = {}
    messages: list[str] = []
    if algorithm == "ulp_compare" and not needs_reference(algorithm, device_dtype, th):  # 26.x fp8 outputs
        prop = _num(metrics.get("ulp_err_proportion"))
        ok = prop < th["ulp_verdict"]["fp8_26x"]["ulp_err_proportion_lt"]
        cells.update(mean_ulp_err=_num(metrics.get("mean_ulp_err")), ulp_err_proportion=prop,
                     ulp_status=PASS if ok else ERROR)
        return (PASS if ok else ERROR), ("" if ok else "ERROR: ULP误差不满足标准"), cells
    if algorithm == "binary_consistency":
        rate = _num(metrics.get("binary_error_rate"))
        cells["binary_error_rate"], cells["binary_status"] = rate, PASS if rate == 0 else ERROR
        if rate:
            messages.append("ERROR: 二进制一致错误率超过阈值")
    elif algorithm == "thousandth_threshold":
        rule = th["thousandth_verdict"]
        value = _num(metrics.get("dual_thousandth"))
        ok = value >= rule["pass_if_fraction_ge"]
        cells["dual_thousandth"], cells["thousandth_status"] = value, PASS if ok else ERROR
        if not ok:
            messages.append("ERROR: 双千指标不达标")
    elif algorithm in ("absolute_threshold", "accumulative_error_compare"):
        for key, status_key, message in (
            ("inf_nan_err_ratio", "inf_nan_status", "ERROR: inf/nan错误率超过阈值"),
            ("rel_err_ratio", "rel_err_status", "ERROR: 相对误差错误率超过阈值"),
            ("abs_err_ratio", "abs_err_status", "ERROR: 绝对误差错误率超过阈值"),
        ):
            value = _num(metrics.get(key))
            cells[key], cells[status_key] = value, PASS if value == 0 else ERROR
            if value:
                messages.append(message)
        if algorithm == "accumulative_error_compare":
            eb = _num(metrics.get("error_balance"))
            limit = per_dtype(th["accumulative_error"]["eb_threshold"], device_dtype)
            cells["eb_ratio"], cells["eb_status"] = eb, PASS if eb <= limit else ERROR
            if eb > limit:
                messages.append("ERROR: 误差均衡性超过阈值")
    else:
        raise ValueError(f"{algorithm} needs a reference device")
    return (ERROR if messages else PASS), "".join(messages), cells


def _ratio(x: float, y: float, floor: float) -> tuple[float, bool]:
    """(ratio, consistent): non-finite values must agree (same-signed inf, or both NaN)."""
    if not (math.isfinite(x) and math.isfinite(y)):
        consistent = (math.isinf(x) and math.isinf(y) and (x > 0) == (y > 0)) or (math.isnan(x) and math.isnan(y))
        return math.nan, consistent
    return abs(x) / max(abs(y), floor), True


def benchmark_thresholds(api_name: str, standard: str, th: Mapping[str, Any]) -> dict[str, float]:
    """8.x thresholds, or 26.x's per-API monitoring level (L0/L1/L2) for rmse and relative errors."""
    limits = dict(th["benchmark_ratio_threshold"])
    if standard == "msprobe26":
        level = next((lv for lv, apis in th["monitoring_level_apis_26x"].items() if api_name in apis), "L0")
        limits.update(th["benchmark_levels_26x"][level])
    return limits


class ApiRules(NamedTuple):
    """The rules one API's outputs are judged by: its name (26.x's monitoring level), the metric standard and
    its thresholds (benchmark_thresholds takes exactly these)."""
    api_name: str
    standard: str
    th: Mapping[str, Any]


def with_reference(algorithm: str, metrics: Mapping[str, Any], ref: Mapping[str, Any], device_dtype: str,
                   rules: ApiRules) -> tuple[str, str, dict[str, Any]]:
    """Benchmark / ULP verdict: the device's error must not be much worse than the reference's."""
    th = rules.th
    floor = per_dtype(th["min_err"], device_dtype)
    cells: dict[str, Any] = {}
    messages: list[str] = []
    if algorithm == "benchmark":
        limits = benchmark_thresholds(*rules)
        failed = False
        for metric, (key, message) in _BENCHMARK.items():
            ratio, consistent = _ratio(_num(metrics.get(key)), _num(ref.get(key)), floor)
            bad = not consistent or (not math.isnan(ratio) and ratio > limits[metric])
            cells[f"{metric}_ratio"], cells[f"{metric}_status"] = ratio, ERROR if bad else PASS
            if bad and metric in th["benchmark_verdict_metrics"]:  # eb is written, not judged (msprobe)
                failed = True
                messages.append(message)
        return (ERROR if failed else PASS), "".join(messages), cells
    if algorithm == "ulp_compare":
        rule = per_dtype(th["ulp_verdict"], device_dtype)
        mean_ulp, prop = _num(metrics.get("mean_ulp_err")), _num(metrics.get("ulp_err_proportion"))
        _, mean_ok = _ratio(mean_ulp, _num(ref.get("mean_ulp_err")), floor)
        ratio, prop_ok = _ratio(prop, _num(ref.get("ulp_err_proportion")), floor)
        cells.update(mean_ulp_err=mean_ulp, ulp_err_proportion=prop, ulp_err_proportion_ratio=ratio)
        ok = mean_ok and prop_ok and (
            ("mean_ulp_err_lt" in rule and mean_ulp < rule["mean_ulp_err_lt"])
            or prop < rule["ulp_err_proportion_lt"] or (not math.isnan(ratio) and ratio < rule["proportion_ratio_lt"])
        )
        cells["ulp_status"] = PASS if ok else ERROR
        return (PASS if ok else ERROR), ("" if ok else "ERROR: ULP误差不满足标准"), cells
    raise ValueError(f"{algorithm} is a single-run algorithm")
