"""Unit and property tests of pytest_msprobe.metrics against straightforward reference computations.

References are written out element by element (Python loops over tiny arrays) with the same dtype
semantics msprobe uses (float32 arithmetic for fp16/bf16 outputs, float64 for fp32 outputs), and must
agree to 1e-12. Where a float32 mean is involved the data keep the float32 sum exact (at most two
non-zero terms, or small integers), so the summation order cannot matter.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_msprobe.metrics import vectorised as M

TOL = 1e-12
F32_EPS = float(np.finfo(np.float32).eps)
F64_EPS = float(np.finfo(np.float64).eps)
PROP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def close(ours, ref) -> bool:
    if ours is None or ref is None:
        return ours is ref
    if math.isnan(ref):
        return math.isnan(ours)
    return abs(ours - ref) <= TOL


def f32(x) -> np.float32:
    return np.float32(x)


def ref_rel_f32(b, d, eps):
    """float32 relative errors |d - b| / (|b| + eps), one element at a time."""
    out = []
    for bi, di in zip(b, d):
        ae = f32(abs(f32(di) - f32(bi)))
        out.append(float(ae / (f32(abs(f32(bi))) + f32(eps))))
    return out


# ------------------------------------------------------------------ column layout
def test_metric_keys_follow_the_details_csv_columns():
    csv_cols = ["余弦相似度", "最大绝对误差", "双百指标", "双千指标", "双万指标", "二进制一致错误率", "误差均衡性",
                "均方根误差", "小值域错误占比", "相对误差最大值", "相对误差平均值", "inf/nan错误率", "相对误差错误率",
                "绝对误差错误率", "ULP误差最大值", "ULP误差平均值", "ULP误差大于阈值占比"]
    assert len(M.METRIC_KEYS) == len(csv_cols) == 17
    assert M.METRIC_KEYS[0] == "cosine" and M.METRIC_KEYS[-1] == "ulp_err_proportion"
    assert M.blank_metrics() == dict.fromkeys(M.METRIC_KEYS)


# ------------------------------------------------------------------ error arrays (parity item 4)
def test_error_arrays_fp16_api_uses_float32_eps():
    b = np.array([1.0, 0.0, -3.0, 1e-3], np.float32)
    d = np.array([1.0009765625, 0.0009765625, -3.0, 0.0], np.float16)
    err = M.error_arrays(b, d, np.finfo(b.dtype).eps)
    assert err.abs_err.dtype == np.float32 and err.rel_err.dtype == np.float32
    ref = ref_rel_f32(b, d, F32_EPS)
    assert all(close(float(o), r) for o, r in zip(err.rel_err, ref))
    # bench == 0: the relative error is |d| / eps(fp32)
    assert close(float(err.rel_err[1]), float(f32(0.0009765625) / f32(F32_EPS)))


def test_error_arrays_fp32_api_uses_float64_eps():
    b = np.array([1.0, 0.0, -3.0], np.float64)
    d = np.array([1.0000001, 1e-7, -3.0], np.float32)
    err = M.error_arrays(b, d, np.finfo(b.dtype).eps)
    assert err.rel_err.dtype == np.float64
    for i in range(3):
        ref = abs(float(d[i]) - b[i]) / (abs(b[i]) + F64_EPS)
        assert close(float(err.rel_err[i]), ref)


def test_error_arrays_bf16_eps_is_2_pow_minus_8():
    b = np.array([0.0, 1.0], np.float32)
    d = np.array([0.0078125, 1.0078125], np.float32)       # bf16 values held in float32
    err = M.error_arrays(b, d, 2.0 ** -8)
    assert err.rel_err.dtype == np.float32
    assert close(float(err.rel_err[0]), 0.0078125 / 2 ** -8)                 # = 2.0 exactly
    assert close(float(err.rel_err[1]), float(f32(0.0078125) / f32(1 + 2 ** -8)))


# ------------------------------------------------------------------ dual ratios (parity item 1)
@pytest.mark.parametrize("t", [0.01, 0.001, 0.0001])
def test_dual_ratio_is_strict_on_both_sides(t):
    n = 10000
    rel = np.zeros(n)
    k = int(round(n * t))
    rel[:k] = t                       # exactly t is NOT "< t"
    ratio, ok = M.dual_ratio(rel, t)
    ref = sum(1 for r in rel if r < t) / n
    assert close(ratio, ref) and ref == 1 - t
    assert ok is False or ok == np.False_      # ratio == 1 - t fails: the check is ratio > 1 - t
    rel[0] = t / 2
    ratio2, ok2 = M.dual_ratio(rel, t)
    assert ratio2 > 1 - t and bool(ok2)


def test_dual_ratio_999_of_1000_fails_thousandth():
    rel = np.zeros(1000)
    rel[0] = 0.5
    assert M.dual_ratio(rel, 0.001) == (0.999, False)


def test_dual_ratio_empty_is_one():
    assert M.dual_ratio(np.zeros(0), 0.001) == (1.0, True)


# ------------------------------------------------------------------ cosine (parity item 3)
def ref_cosine(b, d):
    gm = max(abs(float(x)) for x in b)
    nm = max(abs(float(x)) for x in d)
    g = [float(x) / gm for x in b]
    n = [float(x) / nm for x in d]
    dot = math.fsum(x * y for x, y in zip(n, g))
    return dot / (math.sqrt(math.fsum(x * x for x in n)) * math.sqrt(math.fsum(x * x for x in g)))


COS = dict(zero_eps=2.220446049250313e-16, pass_gt=0.99)


def test_cosine_matches_reference():
    b = np.array([1.5, -2.25, 3.0, 0.125, 7.0], np.float32)
    d = np.array([1.5, -2.0, 3.25, 0.0, 7.0], np.float16)
    cos, ok, msg = M.cosine(b, d, **COS)
    assert close(cos, ref_cosine(b, d)) and ok and msg == ""


def test_cosine_normalises_each_side_before_the_dot_product():
    # squares of 1e200 overflow float64 without the per-side max normalisation
    b = np.array([1e200, -2e200, 3e200], np.float64)
    d = np.array([1e30, -2e30, 3e30], np.float32)
    cos, ok, _ = M.cosine(b, d, **COS)
    assert close(cos, ref_cosine(b, d)) and ok


def test_cosine_special_cases():
    one = np.array([2.0], np.float32)
    assert M.cosine(one, one, **COS) == (None, True, M.COSINE_SCALAR_MSG)
    z = np.zeros(4, np.float32)
    o = np.ones(4, np.float32)
    assert M.cosine(z, z, **COS) == (None, True, M.COSINE_BOTH_ZERO_MSG)
    assert M.cosine(o, z, **COS) == (None, False, M.COSINE_DEVICE_ZERO_MSG)
    assert M.cosine(z, o, **COS) == (None, False, M.COSINE_BENCH_ZERO_MSG)
    nan = np.array([1.0, np.nan, 2.0], np.float32)
    cos, ok, msg = M.cosine(nan, nan, **COS)       # 8.3.3: NaN cosine fails
    assert math.isnan(cos) and ok is False and msg == M.COSINE_NAN_MSG
    inf = np.array([1.0, np.inf], np.float32)
    cos, ok, _ = M.cosine(inf, inf, **COS)
    assert math.isnan(cos) and ok is False
    cos, ok, _ = M.cosine(o, -o, **COS)
    assert cos == -1.0 and not ok


# ------------------------------------------------------------------ masks, error balance (parity item 5)
def test_finite_mask_rounds_the_bench_to_the_device_dtype():
    b = np.array([1.0, 70000.0, np.inf, 1.0], np.float32)       # 70000 overflows fp16
    d = np.array([1.0, 65504.0, np.inf, np.nan], np.float16)
    both, bench_dev = M.finite_mask(b, d)
    assert both.tolist() == [True, False, False, False]
    assert bench_dev.dtype == np.float16 and np.isinf(bench_dev[1])
    both32, bench_dev32 = M.finite_mask(b, d.astype(np.float32), np.dtype(np.float16))
    assert both32.tolist() == both.tolist() and bench_dev32.dtype == np.float32 and np.isinf(bench_dev32[1])


def test_error_balance_compares_with_the_rounded_bench():
    # 1 + 2**-12 rounds to 1.0 in fp16: that element is balanced, not "device smaller"
    b = np.array([1 + 2 ** -12, 2.0, 3.0, 4.0, 5.0], np.float32)
    d = np.array([1.0, 2.0078125, 3.0, 3.99609375, 5.00390625], np.float16)
    bench_dev = b.astype(np.float16)
    ref_larger = sum(1 for x, y in zip(d, bench_dev) if float(x) - float(y) > 0)
    ref_smaller = sum(1 for x, y in zip(d, bench_dev) if float(x) - float(y) < 0)
    ref = abs(ref_larger - ref_smaller) / 5
    assert close(M.error_balance(d, bench_dev), ref) and ref == 0.2
    assert M.error_balance(d, b.astype(np.float32)) == 0.0        # unrounded bench would count element 0
    assert M.error_balance(np.zeros(0, np.float16), np.zeros(0, np.float16)) == 0.0


# ------------------------------------------------------------------ absolute threshold
def test_absolute_threshold_metrics_fp16():
    rtol, sv, atol = 2.0 ** -10, 2.0 ** -10, 2.0 ** -16
    b = np.array([1.0, 2.0, 3.0, 0.0005, 0.0002, 1.0, np.inf, 70000.0], np.float32)
    d = np.array([1.001953125, 2.0, 3.0, 0.0005, 0.00025, np.nan, np.inf, 65504.0], np.float16)
    err = M.error_arrays(b, d, np.finfo(np.float32).eps)
    both, bench_dev = M.finite_mask(b, d)
    lo, hi = np.finfo(np.float16).min, np.finfo(np.float16).max
    got = M.absolute_threshold_metrics(err, M.Sides(d, bench_dev, both), rtol=rtol, small_value=sv, atol=atol,
                                       clip_range=(lo, hi))
    # reference: walk the elements
    normal = small = bad = rel_bad = abs_bad = infnan_bad = 0
    for bi, di in zip(b, d):
        with np.errstate(all="ignore"):
            bd = np.float16(bi)
            ae = f32(abs(f32(di) - bi))
        finite = math.isfinite(float(di)) and math.isfinite(float(bd))
        if not finite:
            bad += 1
            gc = np.float16(min(max(float(bd), float(lo)), float(hi)))
            dc = np.float16(min(max(float(di), float(lo)), float(hi))) if not math.isnan(float(di)) else di
            with np.errstate(all="ignore"):
                re = f32(abs(np.float16(dc - gc))) / (f32(abs(bi)) + f32(F32_EPS))
            ok = (re <= rtol) or (math.isnan(float(di)) and math.isnan(float(gc)))
            infnan_bad += not ok
        elif abs(float(bi)) <= sv:
            small += 1
            abs_bad += float(ae) > atol
        else:
            normal += 1
            rel_bad += float(ae / (f32(abs(bi)) + f32(F32_EPS))) > rtol
    assert close(got["inf_nan_err_ratio"], infnan_bad / bad)
    assert close(got["rel_err_ratio"], rel_bad / normal)
    assert close(got["abs_err_ratio"], abs_bad / small)
    assert (bad, normal, small) == (3, 3, 2) and got["rel_err_ratio"] == 1 / 3 and got["abs_err_ratio"] == 0.5
    assert got["inf_nan_err_ratio"] == 1 / 3          # NaN vs 1.0 mismatches; inf==inf and 65504 vs inf match


def test_absolute_threshold_empty_masks_give_zero():
    b = np.array([1.0, 2.0], np.float32)
    err = M.error_arrays(b, b, np.finfo(np.float32).eps)
    both, bd = M.finite_mask(b, b)
    got = M.absolute_threshold_metrics(err, M.Sides(b, bd, both), rtol=1e-3, small_value=1e-3, atol=1e-5,
                                       clip_range=(-1e38, 1e38))
    assert got == {"inf_nan_err_ratio": 0.0, "rel_err_ratio": 0.0, "abs_err_ratio": 0.0}


# ------------------------------------------------------------------ benchmark
def test_benchmark_metrics_fp32_against_reference():
    sv, atol = 2.0 ** -20, 2.0 ** -30
    b = np.array([1.0, -2.0, 3.0, 4e-7, 1e-7, np.inf, 0.5, 8.0], np.float64)
    d = np.array([1.0000001, -2.0000005, 3.0, 4.2e-7, 1e-7, np.inf, 0.49999997, 8.000001], np.float32)
    err = M.error_arrays(b, d, np.finfo(np.float64).eps)
    both, bd = M.finite_mask(b, d)
    got = M.benchmark_metrics(err, M.Sides(d, bd, both), small_value=sv, atol=atol, rmse_fudge=(1e-4, 1e-4))
    rel, sq, n_small, small_bad, larger, smaller = [], [], 0, 0, 0, 0
    for bi, di in zip(b, d):
        bd_i = float(np.float32(bi))
        diff = float(di) - bd_i if math.isfinite(bd_i) and math.isfinite(float(di)) else float("nan")
        larger += diff > 0
        smaller += diff < 0
        if not (math.isfinite(float(di)) and math.isfinite(bd_i)):
            continue
        ae = abs(float(di) - bi)
        if abs(bi) <= sv:
            n_small += 1
            small_bad += ae > atol
        else:
            rel.append(ae / (abs(bi) + F64_EPS))
            sq.append(ae * ae)
    n = len(b)
    k = n - len(rel)
    assert close(got["small_value_err_ratio"], small_bad / n_small)
    assert close(got["max_rel_err"], max(rel))
    assert close(got["mean_rel_err"], math.fsum(rel) / len(rel))
    assert close(got["rmse"], math.sqrt(math.fsum(sq) / n * (n / (n - k + 1e-4) + 1e-4)))
    assert close(got["error_balance"], abs(larger - smaller) / n)


def test_benchmark_metrics_fp16_float32_arithmetic():
    # two normal elements only: the float32 sums have a single rounding, so order cannot matter
    sv = 2.0 ** -10
    b = np.array([1.1, 0.0001, 3.3, 0.0], np.float32)
    d = np.array([1.099609375, 0.0001, 3.30078125, 0.0], np.float16)
    err = M.error_arrays(b, d, np.finfo(np.float32).eps)
    both, bd = M.finite_mask(b, d)
    got = M.benchmark_metrics(err, M.Sides(d, bd, both), small_value=sv, atol=1e-16, rmse_fudge=(1e-4, 1e-4))
    rel = [r for r, bi in zip(ref_rel_f32(b, d, F32_EPS), b) if abs(float(bi)) > sv]
    ae = [f32(abs(f32(di) - bi)) for bi, di in zip(b, d) if abs(float(bi)) > sv]
    assert close(got["max_rel_err"], max(rel))
    assert close(got["mean_rel_err"], float(f32(f32(rel[0]) + f32(rel[1])) / f32(2)))
    mse = f32(f32(ae[0] * ae[0]) + f32(ae[1] * ae[1])) / f32(4)
    assert close(got["rmse"], math.sqrt(float(mse) * (4 / (2 + 1e-4) + 1e-4)))
    small_ae = [f32(abs(f32(di) - bi)) for bi, di in zip(b, d) if abs(float(bi)) <= sv]
    assert close(got["small_value_err_ratio"], sum(float(x) > 1e-16 for x in small_ae) / len(small_ae))
    assert got["small_value_err_ratio"] == 0.5       # fp16(1e-4) != fp32(1e-4): atol 1e-16 counts any error


def test_benchmark_all_masked_gives_zero_relative_errors():
    b = np.array([0.0, 1e-9], np.float64)
    d = np.array([0.0, 2e-9], np.float32)
    err = M.error_arrays(b, d, np.finfo(np.float64).eps)
    both, bd = M.finite_mask(b, d)
    got = M.benchmark_metrics(err, M.Sides(d, bd, both), small_value=2.0 ** -20, atol=2.0 ** -30,
                              rmse_fudge=(1e-4, 1e-4))
    assert got["max_rel_err"] == 0.0 and got["mean_rel_err"] == 0.0 and got["rmse"] == 0.0
    assert close(got["small_value_err_ratio"], 0.5)


# ------------------------------------------------------------------ ULP
def ref_ulp(b, d, m, min_eb, cd):
    out = []
    for bi, di in zip(b, d):
        if bi == 0:
            e = 0                               # msprobe's zero quirk: exponent 0, not min_eb
        else:
            e = math.frexp(abs(float(bi)))[1] - 1
        e = max(e, min_eb)
        diff = cd(cd(di) - cd(bi))
        out.append(abs(float(diff * cd(2.0 ** (m - e)))))
    return out


def test_ulp_fp16_quirk_and_reference():
    b = np.array([1.0, 3.0, 0.0, 2.0 ** -20, 1000.0, -0.5], np.float32)
    d = np.array([1.0009765625, 3.0, 2.0 ** -20, 2.0 ** -20, 1001.0, -0.5009765625], np.float16)
    ulp = M.ulp_errors(b, d, np.abs(b), mantissa_bits=10, min_exponent=-14, compute_dtype="float32")
    assert ulp.dtype == np.float32
    ref = ref_ulp(b, d, 10, -14, np.float32)
    assert all(close(float(o), r) for o, r in zip(ulp, ref))
    assert float(ulp[2]) == 2.0 ** -10                   # the verified zero quirk (§9.6)
    got = M.ulp_metrics(ulp, 1)
    assert close(got["max_ulp_err"], max(ref))
    assert close(got["mean_ulp_err"], math.fsum(ref) / 6)   # small dyadic values: the float32 sum is exact
    assert close(got["ulp_err_proportion"], sum(r > 1 for r in ref) / 6)


def test_ulp_fp32_in_float64():
    b = np.array([1.0 + 2 ** -30, 3.0, 0.0, 1e-40, 1024.5], np.float64)
    d = np.array([1.0, 3.0000002, 1e-45, 0.0, 1024.5], np.float32)
    ulp = M.ulp_errors(b, d, np.abs(b), mantissa_bits=23, min_exponent=-126, compute_dtype="float64")
    ref = ref_ulp(b, d, 23, -126, np.float64)
    assert ulp.dtype == np.float64 and all(close(float(o), r) for o, r in zip(ulp, ref))
    got = M.ulp_metrics(ulp, 32)
    assert close(got["ulp_err_proportion"], sum(r > 32 for r in ref) / 5)


# ------------------------------------------------------------------ binary, rmse, dropout
def test_binary_error_rate_and_zero_fraction():
    b = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    d = np.array([1.0, 2.0, 3.001953125, 4.0], np.float16)
    assert M.binary_error_rate(b, d) == 0.25
    assert M.binary_error_rate(np.array([1, 2], np.int64), np.array([1, 2], np.int64)) == 0.0
    assert M.zero_fraction_diff(np.array([0.0, 1.0, 0.0, 2.0]), np.array([0.0, 1.0, 3.0, 2.0])) == 0.25


def test_rmse_fudge():
    ae = np.array([3.0, 4.0, 100.0, 0.0], np.float64)
    keep = np.array([True, True, False, True])
    ref = math.sqrt((9 + 16) / 4 * (4 / (3 + 1e-4) + 1e-4))
    assert close(M.rmse(ae, keep, 3, 1e-4, 1e-4), ref)


# ------------------------------------------------------------------ properties
floats64 = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@PROP
@given(hnp.arrays(np.float32, st.integers(2, 40), elements=floats64),
       hnp.arrays(np.float32, st.integers(2, 40), elements=floats64))
def test_cosine_in_range(b, d):
    n = min(b.size, d.size)
    cos, ok, _ = M.cosine(b[:n].astype(np.float64), d[:n], **COS)
    assert cos is None or -1.0 <= cos <= 1.0
    assert ok == (cos is not None and cos > 0.99) or cos is None


@PROP
@given(hnp.arrays(np.float32, st.integers(2, 60), elements=floats64))
def test_identical_outputs_have_zero_errors(x):
    b = x.astype(np.float64)
    err = M.error_arrays(b, x, np.finfo(np.float64).eps)
    assert not err.abs_err.any() and not err.rel_err.any()
    both, bd = M.finite_mask(b, x)
    bm = M.benchmark_metrics(err, M.Sides(x, bd, both), small_value=2.0 ** -20, atol=2.0 ** -30, rmse_fudge=(1e-4, 1e-4))
    assert bm == {"small_value_err_ratio": 0.0, "max_rel_err": 0.0, "mean_rel_err": 0.0, "rmse": 0.0,
                  "error_balance": 0.0}
    ulp = M.ulp_errors(b, x, np.abs(b), mantissa_bits=23, min_exponent=-126, compute_dtype="float64")
    assert not ulp.any()
    assert M.dual_ratio(err.rel_err, 0.0001) == (1.0, True)


@PROP
@given(st.data())
def test_metrics_invariant_to_element_order(data):
    n = data.draw(st.integers(2, 50))
    b = data.draw(hnp.arrays(np.float32, n, elements=floats64)).astype(np.float64)
    d = data.draw(hnp.arrays(np.float32, n, elements=floats64))
    perm = np.array(data.draw(st.permutations(range(n))))

    def all_metrics(bb, dd):
        err = M.error_arrays(bb, dd, np.finfo(np.float64).eps)
        both, bd = M.finite_mask(bb, dd)
        out = M.benchmark_metrics(err, M.Sides(dd, bd, both), small_value=2.0 ** -20, atol=2.0 ** -30,
                                  rmse_fudge=(1e-4, 1e-4))
        out.update(M.absolute_threshold_metrics(err, M.Sides(dd, bd, both), rtol=2.0 ** -20, small_value=2.0 ** -20,
                                                atol=2.0 ** -30, clip_range=(-3e38, 3e38)))
        out.update(M.ulp_metrics(M.ulp_errors(bb, dd, err.abs_bench, mantissa_bits=23, min_exponent=-126,
                                              compute_dtype="float64"), 32))
        out["dual"] = M.dual_ratio(err.rel_err, 0.001)[0]
        out["cos"] = M.cosine(bb, dd, **COS)[0]
        return out

    a, p = all_metrics(b, d), all_metrics(b[perm], d[perm])
    for key, va in a.items():
        vb = p[key]
        if va is None:
            assert vb is None
        else:   # sums are re-associated by the permutation: equal up to float64 rounding
            assert math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-12), key


@PROP
@given(hnp.arrays(np.float64, st.integers(1, 50), elements=st.floats(0, 1)))
def test_dual_ratios_are_nested(rel):
    r100, r1000, r10000 = (M.dual_ratio(rel, t)[0] for t in (0.01, 0.001, 0.0001))
    assert 1.0 >= r100 >= r1000 >= r10000 >= 0.0


@PROP
@given(st.data())
def test_relative_errors_of_a_subset_equal_the_whole_arrays(data):
    """ErrorArrays.rel_err_at gives, bit for bit, the elements of rel_err at a mask (before and after the whole
    array exists), for float32 and float64 benches and either kind of eps."""
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    n = data.draw(st.integers(1, 40))
    values = st.floats(-1e6, 1e6, width=32) | st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan])
    b = data.draw(hnp.arrays(dtype, n, elements=values))
    d = data.draw(hnp.arrays(dtype, n, elements=values))
    eps = data.draw(st.sampled_from([2.0 ** -8, np.finfo(dtype).eps, 1e-300]))
    mask = data.draw(hnp.arrays(np.bool_, n))
    err = M.error_arrays(b, d, eps)
    count = int(np.count_nonzero(mask))
    subset = err.rel_err_at(mask, count)
    whole = M.error_arrays(b, d, eps).rel_err
    assert subset.dtype == whole.dtype
    assert subset.tobytes() == whole[mask].tobytes()
    assert err.rel_err_at(slice(0, 1), 1).tobytes() == whole[:1].tobytes()
    _ = err.rel_err  # made now: the subset comes from it
    assert err.rel_err_at(mask, count).tobytes() == whole[mask].tobytes()
