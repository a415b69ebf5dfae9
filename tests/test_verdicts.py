"""msprobe's new-standard decisions (api_precision_compare rules, REFERENCE §4.3)."""
from __future__ import annotations

import math

import pytest

from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict.verdicts import ApiRules, benchmark_thresholds, single_run, with_reference

TH = load_specs()["thresholds"]


def bench_metrics(**kw: float) -> dict[str, float]:
    base = {"small_value_err_ratio": 0.0, "rmse": 1e-3, "max_rel_err": 1e-2, "mean_rel_err": 1e-3, "error_balance": 0.1}
    return {**base, **kw}


def test_single_run_rules() -> None:
    assert single_run("binary_consistency", {"binary_error_rate": 0.0}, "torch.int64", TH)[0] == "pass"
    status, message, cells = single_run("binary_consistency", {"binary_error_rate": 0.5}, "torch.int64", TH)
    assert (status, message, cells["binary_status"]) == ("error", "ERROR: 二进制一致错误率超过阈值", "error")
    assert single_run("thousandth_threshold", {"dual_thousandth": 0.999}, "torch.float32", TH)[0] == "pass"
    assert single_run("thousandth_threshold", {"dual_thousandth": 0.9989}, "torch.float32", TH)[0] == "error"
    status, message, cells = single_run("absolute_threshold", {"inf_nan_err_ratio": 0, "rel_err_ratio": 0.1,
                                                               "abs_err_ratio": 0.2}, "torch.float16", TH)
    assert status == "error" and message == "ERROR: 相对误差错误率超过阈值ERROR: 绝对误差错误率超过阈值"
    assert (cells["inf_nan_status"], cells["rel_err_status"], cells["abs_err_status"]) == ("pass", "error", "error")
    assert single_run("accumulative_error_compare", {"error_balance": 2 ** -13}, "torch.float32", TH)[0] == "error"
    with pytest.raises(ValueError):
        single_run("benchmark", {}, "torch.float32", TH)


def test_benchmark_ratios_floor_and_thresholds() -> None:
    ref = bench_metrics()
    assert with_reference("benchmark", bench_metrics(), ref, "torch.float32", ApiRules("add", "msprobe", TH))[0] == "pass"
    status, message, cells = with_reference("benchmark", bench_metrics(rmse=2.5e-3), ref, "torch.float32",
                                            ApiRules("add", "msprobe", TH))
    assert status == "error" and "均方根误差比值超过阈值" in message and cells["rmse_ratio"] == pytest.approx(2.5)
    # ratio floors the reference at min_err: a tiny reference does not make every device error infinite
    status, _, cells = with_reference("benchmark", bench_metrics(rmse=1e-5), bench_metrics(rmse=0.0),
                                      "torch.float32", ApiRules("add", "msprobe", TH))
    assert status == "pass" and cells["rmse_ratio"] == pytest.approx(1e-5 / 2 ** -14)
    # error balance is written but not part of the verdict (msprobe)
    status, _, cells = with_reference("benchmark", bench_metrics(error_balance=0.9), ref, "torch.float32",
                                      ApiRules("add", "msprobe", TH))
    assert status == "pass" and cells["eb_status"] == "error"


def test_benchmark_non_finite_metrics_must_agree() -> None:
    ref = bench_metrics(rmse=math.inf)
    assert with_reference("benchmark", bench_metrics(rmse=math.inf), ref, "torch.float16", ApiRules("x", "msprobe", TH))[0] == "pass"
    assert with_reference("benchmark", bench_metrics(rmse=math.nan), ref, "torch.float16", ApiRules("x", "msprobe", TH))[0] == "error"


def test_msprobe26_levels() -> None:
    assert benchmark_thresholds("matmul", "msprobe", TH)["rmse"] == 2
    assert benchmark_thresholds("matmul", "msprobe26", TH)["rmse"] == 1.2     # L2
    assert benchmark_thresholds("embedding", "msprobe26", TH)["max_rel_err"] == 5.0  # L1
    assert benchmark_thresholds("relu", "msprobe26", TH)["rmse"] == 2.0       # L0


@pytest.mark.parametrize("dtype, metrics, ref, expected", [
    ("torch.float32", {"mean_ulp_err": 10, "ulp_err_proportion": 0.5}, {"ulp_err_proportion": 0.1}, "pass"),
    ("torch.float32", {"mean_ulp_err": 100, "ulp_err_proportion": 0.04}, {"ulp_err_proportion": 0.01}, "pass"),
    ("torch.float32", {"mean_ulp_err": 100, "ulp_err_proportion": 0.5}, {"ulp_err_proportion": 0.6}, "pass"),
    ("torch.float32", {"mean_ulp_err": 100, "ulp_err_proportion": 0.5}, {"ulp_err_proportion": 0.1}, "error"),
    ("torch.float16", {"mean_ulp_err": 1, "ulp_err_proportion": 0.0005}, {"ulp_err_proportion": 0.0}, "pass"),
    ("torch.bfloat16", {"mean_ulp_err": 1, "ulp_err_proportion": 0.01}, {"ulp_err_proportion": 0.0}, "error"),
])
def test_ulp_rules(dtype, metrics, ref, expected) -> None:
    assert with_reference("ulp_compare", metrics, {"mean_ulp_err": 1, **ref}, dtype, ApiRules("mm", "msprobe", TH))[0] == expected
