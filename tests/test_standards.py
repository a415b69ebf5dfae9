"""Tests of pytest_msprobe.standards: msprobe's Layer-1 verdict, the Layer-2 columns, structure rules.

GOLDEN holds rows recorded from msprobe 8.3.3 itself (Comparator._compare_core run on CPU tensors under
numpy 1.26): (api, device dtype, bench values, device values, the 17 metric cells, status). Bench values
are exact in the bench dtype (fp32 for fp16/bf16 outputs, fp64 for fp32/fp64 outputs), device values
exact in the device dtype. The other tests check each rule of REFERENCE-msprobe.md §4.1/§9.7 against a
reference written out by hand.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytest_msprobe.metrics.vectorised import METRIC_KEYS
from pytest_msprobe.specs.loader import SpecError, load_specs
from pytest_msprobe.verdict import layer2
from pytest_msprobe.verdict import standards as S

NAN, INF = float("nan"), float("inf")
TOL = 1e-12
PROP = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BENCH_NP = {"torch.float16": np.float32, "torch.bfloat16": np.float32, "torch.float32": np.float64,
            "torch.float64": np.float64}
DEVICE_NP = {"torch.float16": np.float16, "torch.bfloat16": np.float32, "torch.float32": np.float32,
             "torch.float64": np.float64}
BENCH_DT = {"torch.float16": "torch.float32", "torch.bfloat16": "torch.float32", "torch.float32": "torch.float64",
            "torch.float64": "torch.float64"}
STATUSES = {"pass", "Warning", "error", "SKIP"}

GOLDEN = [
    ('add', 'torch.float16',
     [1.000100016593933, -2.5, 3.141590118408203, 9.999999747378752e-05, 0.0, 700.2999877929688],
     [1.0, -2.5, 3.140625, 0.00010001659393310547, 2.002716064453125e-05, 700.5],
     [0.9999999999957948, 0.20001220703125, 0.8333333333333334, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 0.0, 0.0,
      0.5, ' ', ' ', ' '],
     'error'),
    ('add', 'torch.bfloat16',
     [1.0010000467300415, -2.5299999713897705, 3.141590118408203, 9.999999747378752e-05, 0.0, 7.300000190734863],
     [1.0, -2.53125, 3.140625, 0.00010013580322265625, 0.0, 7.3125],
     [0.999999689152057, 0.012499809265136719, 1.0, 0.8333333333333334, ' ', ' ', ' ', ' ', ' ', ' ', ' ', 0.0,
      0.0, 0.5, ' ', ' ', ' '],
     'Warning'),
    ('add', 'torch.float16',
     [1.0, INF, -INF, NAN, 70000.0, 2.0],
     [1.0, INF, 65504.0, NAN, INF, NAN],
     [NAN, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 0.4, 0.0, 0.0, ' ', ' ', ' '],
     'error'),
    ('matmul', 'torch.float16',
     [1.000100016593933, -2.5, 3.141590118408203, 0.0, 0.0, 700.2999877929688],
     [1.0, -2.5, 3.142578125, 0.0, 9.5367431640625e-07, 701.0],
     [0.9999999999877027, 0.70001220703125, 0.8333333333333334, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
      ' ', 1.4000244140625, 0.3348795473575592, 0.16666666666666666],
     'error'),
    ('matmul', 'torch.float32',
     [1.0000001, -2.5, 3.14159265358979, 0.0, 1e-30, 700.3],
     [1.0, -2.500000238418579, 3.141592502593994, 1.0000000116860974e-07, 1.0000000031710769e-30, 700.300048828125],
     [1.0, 4.8828125045474735e-05, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 1.0,
      0.6907940922925869, 0.0],
     'pass'),
    ('softmax', 'torch.bfloat16',
     [0.5, 0.25, 9.999999747378752e-06, 0.0, 0.125, 9.999999747378752e-05],
     [0.5, 0.25, 0.0, 0.0, 0.125, 0.00010013580322265625],
     [0.9999999998475909, 9.999999747378752e-06, ' ', ' ', ' ', ' ', 0.0, 0.0, 0.6666666666666666, 0.0, 0.0, ' ',
      ' ', ' ', ' ', ' ', ' '],
     'pass'),
    ('softmax', 'torch.float32',
     [0.5, 0.2500001, 1e-08, 3e-07, 0.125, 0.0001],
     [0.5, 0.25, 1.999999987845058e-08, 3.000000106112566e-07, 0.1250000149011612, 0.00010001000191550702],
     [0.9999999999999867, 1.0000000000287557e-07, ' ', ' ', ' ', ' ', 0.3333333333333333, 5.0799884381140654e-08,
      0.5, 0.00010001915506991565, 2.51345910498695e-05, ' ', ' ', ' ', ' ', ' ', ' '],
     'pass'),
    ('softmax', 'torch.float16',
     [0.5099999904632568, 0.25999999046325684, 9.999999747378752e-06, 0.0, 0.12999999523162842, 100.69999694824219],
     [0.5, 0.25, 2.002716064453125e-05, 0.0, 0.125, 100.75],
     [0.9999999885049528, 0.0500030517578125, 0.3333333333333333, ' ', ' ', ' ', 0.16666666666666666,
      0.026102769492621202, 0.5, 0.038461484014987946, 0.024256831035017967, ' ', ' ', ' ', ' ', ' ', ' '],
     'error'),
    ('abs', 'torch.float16',
     [1.000100016593933, 2.0, 3.0, 4.0, 5.0, 6.0],
     [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
     [0.9999999999456409, 0.00010001659393310547, ' ', ' ', ' ', 0.16666666666666666, ' ', ' ', ' ', ' ', ' ', ' ',
      ' ', ' ', ' ', ' ', ' '],
     'pass'),
    ('conv2d', 'torch.float16',
     [10.010000228881836, 20.0, -30.5, 0.5, 1.0, 2.0],
     [10.0, 20.0, -30.5, 0.5, 1.0, 2.0],
     [0.9999999675983702, 0.010000228881835938, 1.0, 1.0, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
      ' ', ' '],
     'pass'),
    ('test_api', 'torch.float32',
     [10.000001, 20.0, -30.5, 0.5, 0.001, 2.0],
     [10.0, 20.0, -30.5, 0.5, 0.0010001000482589006, 2.0],
     [0.9999999999999997, 9.999999992515995e-07, ' ', ' ', ' ', ' ', 0.0, ' ', ' ', ' ', ' ', 0.0, 0.0, 0.0, ' ',
      ' ', ' '],
     'pass'),
    ('softmax', 'torch.float64',
     [1.0, 2.0, 3.0001, 4.0, 5.0, 6.0],
     [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
     [0.9999999999504895, 0.00010000000000021103, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ',
      ' ', ' '],
     'pass'),
    ('add', 'torch.float32',
     [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
     [1.0, 2.0, 3.003000020980835, 4.0, 5.0, 6.0],
     [0.9999999554483568, 0.003000020980834961, ' ', 0.8333333333333334, 0.8333333333333334, ' ', ' ', ' ', ' ',
      ' ', ' ', 0.0, 0.16666666666666666, 0.0, ' ', ' ', ' '],
     'error'),
    ('add', 'torch.float32',
     [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
     [1.0, 2.0, 3.0002999305725098, 4.0, 5.0, 6.0],
     [0.9999999995546167, 0.0002999305725097656, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 0.0,
      0.16666666666666666, 0.0, ' ', ' ', ' '],
     'pass'),
    ('add', 'torch.float16',
     [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
     [1.0, 2.0, 3.05078125, 4.0, 5.0, 6.0],
     [0.9999872753260964, 0.05078125, 0.8333333333333334, ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 0.0,
      0.16666666666666666, 0.0, ' ', ' ', ' '],
     'error'),
]


def close(ours, ref) -> bool:
    if ref is None or ref == " ":
        return ours is None
    if ours is None:
        return False
    if math.isnan(ref):
        return math.isnan(ours)
    return abs(ours - ref) <= TOL


def run(bench, device, device_dtype, api="softmax", shape=None, bench_dtype=None):
    b = np.asarray(bench, BENCH_NP[device_dtype])
    d = np.asarray(device, np.float64).astype(DEVICE_NP[device_dtype])
    if device_dtype == "torch.bfloat16":          # keep device values bf16-representable
        d = bf16_round(d)
    if shape is not None:
        b, d = b.reshape(shape), d.reshape(shape)
    return S.compare_tensor("T.api.0.forward.output.0", b, d, bench_dtype=bench_dtype or BENCH_DT[device_dtype],
                            device_dtype=device_dtype, judging=S.Judging(api))


def bf16_round(x) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest-even) and keep them in float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def converter(x):
    if x is None:
        return ("none", None, None)
    if isinstance(x, np.ndarray):
        return ("tensor", x, f"torch.{x.dtype}")
    return ("scalar", x, None)


# ------------------------------------------------------------------ golden rows from msprobe 8.3.3
@pytest.mark.parametrize("api,dtype,bench,device,cells,status", GOLDEN,
                         ids=[f"{g[0]}-{g[1][6:]}-{i}" for i, g in enumerate(GOLDEN)])
def test_matches_msprobe_golden_rows(api, dtype, bench, device, cells, status):
    row = run(bench, device, dtype, api)
    assert row.status == status
    for key, cell in zip(METRIC_KEYS, cells):
        assert close(row.metrics[key], cell), (key, row.metrics[key], cell)


# ------------------------------------------------------------------ hand cases
def test_bf16_exactly_rounded_add_is_a_warning():
    rng = np.random.default_rng(3)
    x, y = bf16_round(rng.uniform(1, 4, 16)), bf16_round(rng.uniform(1, 4, 16))
    bench = (x + y).astype(np.float32)           # fp32 bench of the bf16 add
    device = bf16_round(bench)                   # perfectly rounded bf16 result
    row = run(bench, device, "torch.bfloat16", "add")
    rel = [abs(float(d) - float(b)) / (abs(float(b)) + 2 ** -8) for b, d in zip(bench, device)]
    ref1000 = sum(r < 0.001 for r in rel) / 16
    assert row.metrics["max_abs_err"] >= 0.001
    assert close(row.metrics["dual_hundredth"], 1.0)
    assert close(row.metrics["dual_thousandth"], ref1000) and ref1000 <= 0.999
    assert row.status == "Warning" and row.message.endswith(S.MSG_R1000_WARNING)
    assert row.metrics["dual_ten_thousandth"] is None
    assert row.metrics["rel_err_ratio"] is not None          # add -> absolute-threshold columns


def test_fp16_exactly_rounded_result_passes():
    rng = np.random.default_rng(4)
    bench = rng.uniform(10, 100, 64).astype(np.float32)
    device = bench.astype(np.float16)
    row = run(bench, device, "torch.float16", "mul")
    assert row.metrics["max_abs_err"] >= 0.001
    assert row.metrics["dual_thousandth"] == 1.0 and row.status == "pass"
    assert row.message == S.MSG_R1000_PASS


def test_max_abs_below_0001_short_circuits_to_pass():
    bench = np.full(10, 1e-4)
    device = np.full(10, 3e-4)                   # 200 % relative error, but tiny
    row = run(bench, device, "torch.float32")
    assert row.status == "pass" and row.message == S.MSG_MAX_ABS_PASS
    assert close(row.metrics["max_abs_err"], float(np.float32(3e-4)) - 1e-4)
    assert all(row.metrics[k] is None for k in ("dual_hundredth", "dual_thousandth", "dual_ten_thousandth"))
    # exactly float32(0.001) is not "< 0.001"
    row = run([0.0, 1.0], [0.001, 1.0], "torch.float32")
    assert row.metrics["max_abs_err"] == float(np.float32(0.001)) and row.metrics["dual_thousandth"] is not None


def test_nan_makes_cosine_fail():
    row = run([1.0, NAN, 2.0], [1.0, NAN, 2.0], "torch.float16")
    assert row.status == "error" and math.isnan(row.metrics["cosine"])
    assert "Dump data has NaN when comparing with Cosine Similarity." in row.message
    assert row.metrics["max_abs_err"] is None


def test_single_element_skips_cosine():
    row = run([2.0], [2.5], "torch.float32")
    assert row.metrics["cosine"] is None and row.message.startswith(S.M.COSINE_SCALAR_MSG)
    assert row.status == "error" and row.metrics["dual_thousandth"] == 0.0 and row.metrics["dual_ten_thousandth"] == 0.0
    assert run([2.0], [2.0], "torch.float32").status == "pass"


def test_all_zero_outputs():
    both = run([0.0] * 4, [0.0] * 4, "torch.float16")
    assert both.status == "pass" and both.metrics["cosine"] is None and both.metrics["max_abs_err"] == 0.0
    one = run([0.0] * 4, [1.0] * 4, "torch.float16")
    assert one.status == "error" and one.metrics["cosine"] is None
    assert one.message.startswith("All the data is zero in bench dump data.")


def test_shape_mismatch_is_an_error():
    row = S.compare_tensor("x", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float16), bench_dtype="torch.float32",
                           device_dtype="torch.float16", judging=S.Judging("add"))
    assert row.status == "error" and row.shape == [3, 2]
    assert row.message == "The shape of benchtorch.Size([2, 3]) and nputorch.Size([3, 2]) not equal."
    assert all(v is None for v in row.metrics.values())


def test_int8_is_not_comparable():
    a = np.array([1, 2], np.int8)
    row = S.compare_tensor("x", a, a, bench_dtype="torch.int8", device_dtype="torch.int8", judging=S.Judging("x"))
    assert row.status == "error"
    assert row.message == "Bench out dtype is int8 but npu output dtype is int8, cannot compare."


def test_float_vs_int_is_not_comparable():
    row = S.compare_tensor("x", np.ones(2, np.float32), np.ones(2, np.int64), bench_dtype="torch.float32",
                           device_dtype="torch.int64", judging=S.Judging("x"))
    assert row.status == "error" and "cannot compare" in row.message


@pytest.mark.parametrize("b,d,bt,dt,rate", [
    (np.array([1, 2, 3]), np.array([1, 2, 4]), "torch.int64", "torch.int64", 1 / 3),
    (np.array([1, 2], np.int64), np.array([1, 2], np.int32), "torch.int64", "torch.int32", 0.0),
    (np.array([True, False]), np.array([True, False]), "torch.bool", "torch.bool", 0.0),
    (np.array([True, False]), np.array([1, 1], np.uint8), "torch.bool", "torch.uint8", 0.5),
])
def test_integer_outputs_judged_by_binary_error_rate(b, d, bt, dt, rate):
    row = S.compare_tensor("x", b, d, bench_dtype=bt, device_dtype=dt, judging=S.Judging("argmax"))
    ref = sum(int(x) != int(y) for x, y in zip(b, d)) / len(b)
    assert close(row.metrics["binary_error_rate"], ref) and ref == rate
    assert row.status == ("pass" if rate == 0 else "error")
    assert row.message == f"Compare algorithm is not supported for {b.dtype} data. Only judged by Error Rate."
    assert sum(v is not None for v in row.metrics.values()) == 1


def test_empty_output_is_an_error():
    row = run([], [], "torch.float16")
    assert row.status == "error" and row.message == "There is not bench calculation result."


def test_fp64_output_has_no_layer2_columns():
    row = run([1.0, 2.0, 3.0], [1.0, 2.0, 3.5], "torch.float64", "add")
    assert row.message.startswith("The data type torch.float64 is not supported for new precision standard.")
    assert all(row.metrics[k] is None for k in METRIC_KEYS[5:])
    assert row.status == "error"


def test_worst_element_is_reported_with_its_index():
    bench = np.arange(12, dtype=np.float64).reshape(3, 4)
    device = bench.astype(np.float32)
    device[2, 1] += 0.5
    row = run(bench, device, "torch.float32", shape=(3, 4))
    assert row.worst == {"index": [2, 1], "device": 9.5, "bench": 9.0, "abs_err": 0.5,
                         "rel_err": 0.5 / (9 + 2.0 ** -52)}


# ------------------------------------------------------------------ parity checklist §9.7
def test_parity_1_ratio_thresholds_are_strict():
    # fp32: 999 of 1000 elements with rel error < 0.001 -> 双千 0.999 is not > 0.999 -> error
    bench = np.linspace(1, 2, 1000)
    device = bench.astype(np.float32)
    device[0] = np.float32(bench[0] * 1.01)
    row = run(bench, device, "torch.float32")
    ref = sum(abs(float(d) - b) / (abs(b) + 2.0 ** -52) < 0.001 for b, d in zip(bench, device)) / 1000
    assert ref == 0.999 and close(row.metrics["dual_thousandth"], ref)
    assert row.status == "error" and row.message.endswith(S.MSG_R1000_ERROR)
    # fp16: 99 of 100 with rel < 0.01 -> 双百 0.99 is not > 0.99 -> error
    bench16 = np.linspace(10, 20, 100).astype(np.float16).astype(np.float32)
    device16 = bench16.astype(np.float16)
    device16[5] = np.float16(bench16[5] * 1.5)
    row = run(bench16, device16, "torch.float16")
    assert row.metrics["dual_hundredth"] == 0.99 and row.status == "error" and row.metrics["dual_thousandth"] is None
    # fp32 warning branch: 双千 passes, 9998/10000 under 0.0001 -> Warning
    bench = np.linspace(10, 20, 10000)
    device = bench.astype(np.float32)
    device[:2] = (bench[:2] * (1 + 5e-4)).astype(np.float32)
    row = run(bench, device, "torch.float32")
    assert row.metrics["dual_ten_thousandth"] == 0.9998 and row.status == "Warning"


def test_parity_2_small_outputs_always_pass_layer1():
    bench = np.full(50, 1e-5)
    device = -bench
    assert run(bench, device, "torch.float32").status == "error"        # cosine -1 still fails first
    row = run(bench, bench * 50, "torch.float32")
    assert row.status == "pass" and row.metrics["dual_thousandth"] is None


def test_parity_3_cosine_normalisation_and_scalar():
    bench = np.array([1e200, 2e200, -3e200])
    device = np.array([1e30, 2e30, -3e30], np.float32)
    row = run(bench, device, "torch.float32")
    assert close(row.metrics["cosine"], 1.0) and row.metrics["cosine"] <= 1.0
    assert run([5.0], [5.0], "torch.float16").metrics["cosine"] is None


def test_parity_4_eps_depends_on_the_bench_dtype():
    # bench 0 with device 2**-10: rel = 2**-10 / eps(bench) ; fp16 API -> fp32 eps, fp32 API -> fp64 eps, bf16 -> 2**-8
    for dtype, eps in (("torch.float16", 2.0 ** -23), ("torch.float32", 2.0 ** -52), ("torch.bfloat16", 2.0 ** -8)):
        row = run([0.0, 4.0], [2.0 ** -10, 4.0], dtype)
        assert close(row.worst["rel_err"], 2.0 ** -10 / eps), dtype


def test_parity_5_eb_and_finite_mask_use_the_bench_rounded_to_the_device_dtype():
    bench = [1 + 2 ** -12, 2.0, 70000.0, 3.0, 5.0]         # 1+2**-12 -> 1.0 and 70000 -> inf in fp16
    device = [1.0, 2.0, 65504.0, 3.001953125, 5.00390625]
    row = run(bench, device, "torch.float16", "add")           # absolute threshold
    assert row.metrics["inf_nan_err_ratio"] == 0.0             # 65504 vs clipped inf: within rtol
    row = run(bench, device, "torch.float16", "softmax")       # benchmark
    with np.errstate(over="ignore"):
        rounded = [float(np.float16(b)) for b in bench]
    larger = sum(1 for r, d in zip(rounded, device) if d - r > 0)
    smaller = sum(1 for r, d in zip(rounded, device) if d - r < 0)
    assert (larger, smaller) == (2, 1) and close(row.metrics["error_balance"], abs(larger - smaller) / 5)
    normal = [(b, d) for b, d, r in zip(bench, device, rounded) if math.isfinite(r)]
    rel = [abs(d - b) / (b + 2.0 ** -23) for b, d in normal]
    assert abs(row.metrics["max_rel_err"] - max(rel)) < 1e-7  # float32 arithmetic vs float64 reference


def test_parity_6_benchmark_ratio_floors_and_eb_excluded():
    th = load_specs()["thresholds"]
    assert th["min_err"] == {"torch.float16": 2.0 ** -11, "torch.bfloat16": 2.0 ** -8, "torch.float32": 2.0 ** -14,
                             "default": 2.0 ** -14}
    assert th["benchmark_ratio_threshold"] == {"small_value": 2, "rmse": 2, "max_rel_err": 10, "mean_rel_err": 2,
                                               "eb": 2}
    assert "eb" not in th["benchmark_verdict_metrics"] and len(th["benchmark_verdict_metrics"]) == 4


def test_parity_7_status_literals_and_blank_cells():
    assert (S.PASS, S.WARNING, S.ERROR, S.SKIP, S.BLANK) == ("pass", "Warning", "error", "SKIP", " ")
    rows = S.compare_structure("p", [None, np.ones(3, np.float32)], [None], judging=S.Judging("x"), converter=converter)
    assert [r.status for r in rows] == ["error"] and rows[0].bench_dtype == " " and rows[0].shape is None


def test_parity_8_row_naming():
    b = [np.ones(3, np.float32), np.ones(2, np.float32)]
    rows = S.compare_structure("Functional.linear.0.forward.output", b, b + [np.ones(1, np.float32)],
                               judging=S.Judging("linear"), converter=converter)
    assert [r.name for r in rows] == ["Functional.linear.0.forward.output.0", "Functional.linear.0.forward.output.1"]
    assert [r.status for r in rows] == ["pass", "pass"]


# ------------------------------------------------------------------ algorithm selection, Layer-2 columns
@pytest.mark.parametrize("api,dtype,algo", [
    ("add", "torch.float16", "absolute_threshold"), ("__radd__", "torch.bfloat16", "absolute_threshold"),
    ("abs", "torch.float32", "binary_consistency"), ("matmul", "torch.float16", "ulp_compare"),
    ("__matmul__", "torch.float32", "ulp_compare"), ("conv2d", "torch.float32", "thousandth_threshold"),
    ("test_api", "torch.float16", "accumulative_error_compare"), ("softmax", "torch.float16", "benchmark"),
    ("linalg.vector_norm", "torch.float32", "benchmark"), ("add", "torch.int64", "binary_consistency"),
    ("matmul", "torch.bool", "binary_consistency"), ("add", "torch.float64", "absolute_threshold"),
    ("add", "torch.float8_e4m3fn", "binary_consistency"),
])
def test_algorithm_for(api, dtype, algo):
    specs = load_specs()
    assert layer2.algorithm_for(api, dtype, specs) == algo == layer2.algorithm_for(api, dtype, specs["categories"])


LAYER2_COLUMNS = {
    "absolute_threshold": {"inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio"},
    "benchmark": {"small_value_err_ratio", "max_rel_err", "mean_rel_err", "rmse", "error_balance"},
    "binary_consistency": {"binary_error_rate"},
    "ulp_compare": {"max_ulp_err", "mean_ulp_err", "ulp_err_proportion"},
    "thousandth_threshold": {"dual_thousandth"},
    "accumulative_error_compare": {"inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio", "error_balance"},
}


@pytest.mark.parametrize("api,algo", [("add", "absolute_threshold"), ("softmax", "benchmark"),
                                      ("abs", "binary_consistency"), ("mm", "ulp_compare"),
                                      ("conv1d", "thousandth_threshold"), ("test_api", "accumulative_error_compare")])
@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16", "torch.float32"])
def test_only_the_chosen_algorithm_fills_layer2_columns(api, algo, dtype):
    row = run([1e-5, 0.0], [1e-5, 0.0], dtype, api)       # max-abs short-circuit: Layer 1 fills cosine + max abs
    filled = {k for k, v in row.metrics.items() if v is not None}
    assert filled == {"cosine", "max_abs_err"} | LAYER2_COLUMNS[algo]


def test_accumulative_uses_bound_as_rtol_and_atol():
    bound = 2.0 ** -11                                      # fp32
    bench = [0.5, 0.25, 2.0, 4.0]                            # 0.5 and 0.25 are "small" (<= 1)
    device = [0.5 + 2 * bound, 0.25, 2.0 * (1 + 2 * bound), 4.0]
    row = run(bench, device, "torch.float32", "test_api")
    assert row.metrics["abs_err_ratio"] == 0.5 and row.metrics["rel_err_ratio"] == 0.5
    assert row.metrics["error_balance"] == 0.5


# ------------------------------------------------------------------ structure, scalars, dropout, aggregate
def test_structure_rules():
    t = np.ones(3, np.float32)
    kw = dict(judging=S.Judging("x"), converter=converter)
    assert [r.message for r in S.compare_structure("p", [t, t], [t], **kw)] == [S.MSG_STRUCTURE]
    rows = S.compare_structure("p", [t, None, None, 3], [t, t, None, 3.0], **kw)
    assert [(r.name, r.status, r.message) for r in rows[1:]] == [
        ("p.1", "error", S.MSG_TYPE), ("p.2", "SKIP", S.MSG_BENCH_NONE), ("p.3", "error", S.MSG_TYPE)]
    assert S.compare_structure("p", t, t, **kw)[0].name == "p.0"
    assert S.compare_structure("p", (t,), t, **kw)[0].status == "pass"
    odd = S.compare_structure("p", [1j], [1j], **kw)[0]
    assert odd.status == "error" and odd.message == "Unexpected output type in compare_core: <class 'complex'>"


def test_compare_scalar():
    row = S.compare_scalar("s", 3, 3)
    assert (row.status, row.bench_dtype, row.device_dtype, row.metrics["binary_error_rate"]) == \
        ("pass", "<class 'int'>", "<class 'int'>", 0.0)
    row = S.compare_scalar("s", 2.0, 2.5)
    assert row.status == "error" and row.metrics["binary_error_rate"] is None
    assert S.compare_scalar("s", True, 1).status == "pass"           # isinstance(True, int)
    assert S.compare_scalar("s", 1, True).message == S.MSG_TYPE
    assert S.compare_scalar("s", NAN, NAN).status == "error"
    assert S.compare_scalar("s", "a", "a").status == "pass"


def test_dropout_verdict():
    rng = np.random.default_rng(0)
    b = (rng.random(1000) > 0.5) * 2.0
    d = (rng.random(1000) > 0.5) * 2.0
    ref = abs(sum(b == 0) - sum(d == 0)) / 1000
    status, msg = S.dropout_verdict(b, d)
    assert status == ("pass" if ref < 0.1 else "error") == "pass" and "zero-fraction" in msg
    assert S.dropout_verdict(np.zeros(1000), np.ones(1000))[0] == "error"
    assert S.dropout_verdict(np.zeros(99), np.ones(99))[0] == "pass"


@pytest.mark.parametrize("statuses,result", [
    (["pass", "Warning", "error"], "error"), (["pass", "Warning", "SKIP"], "Warning"), (["SKIP", "pass"], "pass"),
    (["SKIP", "SKIP"], "SKIP"), ([], "SKIP"), (iter(["pass"]), "pass"),
])
def test_aggregate(statuses, result):
    assert S.aggregate(statuses) == result


@PROP
@given(st.lists(st.sampled_from(sorted(STATUSES))))
def test_aggregate_properties(statuses):
    out = S.aggregate(statuses)
    assert out == S.aggregate(list(reversed(statuses)))
    assert out != "pass" or "pass" in statuses
    assert out == "SKIP" or out in statuses


# ------------------------------------------------------------------ serialisation, thresholds file
def test_to_dict_is_json_serialisable():
    row = run([1.0, NAN, 2.0], [1.0, 2.0, 2.0], "torch.float16", "add")
    data = row.to_dict()
    text = json.dumps(data)
    assert set(data) == {"name", "status", "message", "bench_dtype", "device_dtype", "shape", "metrics", "worst",
                         "algorithm", "verdict", "verdict_message", "compare", "reference"}
    assert list(data["metrics"]) == list(METRIC_KEYS) and "NaN" in text
    assert all(v is None or type(v) is float for v in data["metrics"].values())


def test_thresholds_yaml_holds_appendix_a2():
    specs = load_specs()
    assert load_specs() is specs                       # cached
    th = specs["thresholds"]
    assert th["small_value"] == {"torch.float16": 2.0 ** -10, "torch.bfloat16": 2.0 ** -10, "torch.float32": 2.0 ** -20,
                                 "default": 2.0 ** -20}
    assert th["small_value_atol"]["absolute_threshold"] == {"torch.float16": 2.0 ** -16, "torch.bfloat16": 1e-16,
                                                            "torch.float32": 2.0 ** -30, "default": 2.0 ** -30}
    assert th["small_value_atol"]["benchmark"] == {"torch.float16": 1e-16, "torch.bfloat16": 1e-16,
                                                   "torch.float32": 2.0 ** -30, "default": 2.0 ** -30}
    assert th["rtol"] == {"torch.float16": 2.0 ** -10, "torch.bfloat16": 2.0 ** -8, "torch.float32": 2.0 ** -20,
                          "default": 2.0 ** -20}
    acc = th["accumulative_error"]
    assert acc["small_value"] == 1
    assert acc["bound"] == {"torch.float16": 2.0 ** -8, "torch.bfloat16": 2.0 ** -7, "torch.float32": 2.0 ** -11,
                            "default": 2.0 ** -11}
    assert acc["eb_threshold"] == {"torch.float16": 2.0 ** -20, "torch.bfloat16": 2.0 ** -7,
                                   "torch.float32": 2.0 ** -14, "default": 2.0 ** -14}
    assert th["ulp"]["torch.float32"] == {"mantissa_bits": 23, "min_exponent": -126, "compute_dtype": "float64",
                                          "elem_threshold": 32}
    assert th["rel_err_eps"]["torch.bfloat16"] == 2.0 ** -8
    assert th["inf_nan_clip_range"]["torch.bfloat16"] == [-3.3895313892515355e38, 3.3895313892515355e38]
    assert th["rmse_fudge"] == {"denominator_eps": 1e-4, "additive": 1e-4}
    assert th["dropout"] == {"min_numel": 100, "zero_fraction_diff_lt": 0.1}
    l1 = th["layer1"]
    assert (l1["cosine"]["pass_gt"], l1["max_abs_err_pass_lt"]) == (0.99, 0.001)
    assert l1["dual_ratio"] == {"hundredth": 0.01, "thousandth": 0.001, "ten_thousandth": 0.0001}
    cats = specs["categories"]
    assert len(cats["absolute_threshold"]) == 30 and len(cats["ulp_compare"]) == 17
    assert cats["thousandth_threshold"] == ["conv1d", "conv2d"] and cats["accumulative_error_compare"] == ["test_api"]
    assert cats["lookup_order"][0] == "absolute_threshold" and cats["default"] == "benchmark"


def test_yaml_float_pitfall_is_rejected(tmp_path):
    (tmp_path / "thresholds.yaml").write_text("thresholds:\n  x: 1e-16\n", encoding="utf-8")
    (tmp_path / "categories.yaml").write_text("categories: {}\n", encoding="utf-8")
    with pytest.raises(SpecError, match="thresholds.yaml: thresholds.x.*read as a string"):
        load_specs(str(tmp_path))


# ------------------------------------------------------------------ properties
finite32 = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


@PROP
@given(st.sampled_from(["torch.float16", "torch.bfloat16", "torch.float32", "torch.float64"]),
       st.sampled_from(["add", "softmax", "matmul", "abs", "conv2d", "test_api"]),
       hnp.arrays(np.float32, st.integers(1, 30), elements=finite32))
def test_identical_outputs_pass(dtype, api, x):
    d = x.astype(DEVICE_NP[dtype])
    if dtype == "torch.bfloat16":
        d = bf16_round(d)
    b = d.astype(BENCH_NP[dtype])
    row = S.compare_tensor("x", b, d, bench_dtype=BENCH_DT[dtype], device_dtype=dtype, judging=S.Judging(api))
    assert row.status == "pass"
    assert row.metrics["max_abs_err"] in (None, 0.0)


@PROP
@given(st.sampled_from(["torch.float16", "torch.bfloat16", "torch.float32"]),
       st.sampled_from(["add", "softmax", "matmul", "test_api"]),
       st.data())
def test_random_outputs_give_valid_rows(dtype, api, data):
    n = data.draw(st.integers(1, 30))
    b = data.draw(hnp.arrays(np.float32, n, elements=finite32)).astype(BENCH_NP[dtype])
    noise = data.draw(hnp.arrays(np.float32, n, elements=st.floats(-0.125, 0.125, width=32)))
    d = (b * (1 + noise)).astype(DEVICE_NP[dtype])
    if dtype == "torch.bfloat16":
        d = bf16_round(d)
    row = S.compare_tensor("x", b, d, bench_dtype=BENCH_DT[dtype], device_dtype=dtype, judging=S.Judging(api))
    assert row.status in STATUSES - {"SKIP"}
    cos = row.metrics["cosine"]
    assert cos is None or -1.0 <= cos <= 1.0
    for key in ("dual_hundredth", "dual_thousandth", "dual_ten_thousandth", "error_balance", "small_value_err_ratio",
                "inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio", "ulp_err_proportion"):
        v = row.metrics[key]
        assert v is None or 0.0 <= v <= 1.0, key
    json.dumps(row.to_dict())
