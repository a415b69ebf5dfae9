"""The metric columns of msprobe's details CSV, in order (importable without numpy: the xdist
controller writes the CSV files and never needs numpy otherwise)."""
from __future__ import annotations

# Column order of msprobe's details CSV, 余弦相似度 ... ULP误差大于阈值占比 (Appendix A.12).
METRIC_KEYS: tuple[str, ...] = (
    "cosine", "max_abs_err", "dual_hundredth", "dual_thousandth", "dual_ten_thousandth",
    "binary_error_rate", "error_balance", "rmse", "small_value_err_ratio", "max_rel_err", "mean_rel_err",
    "inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio", "max_ulp_err", "mean_ulp_err", "ulp_err_proportion",
)
