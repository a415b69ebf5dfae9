"""The columns of msprobe's details CSV: the header and the metric keys, in order (importable without numpy: the xdist
controller writes the CSV files and never needs numpy otherwise)."""
from __future__ import annotations

# Column order of msprobe's details CSV, 余弦相似度 ... ULP误差大于阈值占比 (Appendix A.12).
METRIC_KEYS: tuple[str, ...] = (
    "cosine", "max_abs_err", "dual_hundredth", "dual_thousandth", "dual_ten_thousandth",
    "binary_error_rate", "error_balance", "rmse", "small_value_err_ratio", "max_rel_err", "mean_rel_err",
    "inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio", "max_ulp_err", "mean_ulp_err", "ulp_err_proportion",
)
# The columns each Layer-2 algorithm writes, in this order (the numpy metrics and those from one pass's statistics).
ALGORITHM_KEYS: dict[str, tuple[str, ...]] = {
    "binary_consistency": ("binary_error_rate",),
    "thousandth_threshold": ("dual_thousandth",),
    "ulp_compare": ("max_ulp_err", "mean_ulp_err", "ulp_err_proportion"),
    "benchmark": ("small_value_err_ratio", "max_rel_err", "mean_rel_err", "rmse", "error_balance"),
    "absolute_threshold": ("inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio"),
    "accumulative_error_compare": ("inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio", "error_balance"),
}

# 23 columns of accuracy_checking_details_*.csv; columns 4..20 are METRIC_KEYS in the same order.
DETAILS_HEADER: tuple[str, ...] = (
    "API Name", "Bench Dtype", "DEVICE Dtype", "Shape",
    "余弦相似度", "最大绝对误差", "双百指标", "双千指标", "双万指标", "二进制一致错误率", "误差均衡性",
    "均方根误差", "小值域错误占比", "相对误差最大值", "相对误差平均值", "inf/nan错误率", "相对误差错误率",
    "绝对误差错误率", "ULP误差最大值", "ULP误差平均值", "ULP误差大于阈值占比",
    "Status", "Message",
)
assert len(DETAILS_HEADER) == 6 + len(METRIC_KEYS), "details header and METRIC_KEYS drifted apart"
