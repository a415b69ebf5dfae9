"""api_specs keys that decide verdicts: thresholds.quantization (msprobe 26.x's rule for integer outputs of
quantisation APIs) and ulp_verdict.fp8_26x (26.x's fp8 ULP rule). preprocess.int_input_to_float: test_execution.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import judge, standards
from tests.helpers import api_records, make_dump, tensor

SPECS = load_specs()
LEAN = ("-p", "no:cacheprovider")


def _int8(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int8)


@pytest.mark.parametrize("standard", ["msprobe", "msprobe26", "strict", "original"])
def test_quantization_apis_allow_one_step_of_rounding(standard: str) -> None:
    bench, one_off, two_off = _int8([0, 5, -7, 127]), _int8([1, 5, -8, 127]), _int8([0, 5, -9, 127])
    for device, status in ((one_off, "pass"), (two_off, "error")):
        row = standards.compare_tensor("NPU.npu_dynamic_quant.0.forward.output.0", bench, device,
                                       bench_dtype="torch.int8", device_dtype="torch.int8",
                                       judging=standards.Judging("npu_dynamic_quant", SPECS, standard))
        judge.decide(row, standard, api_name="npu_dynamic_quant", specs=SPECS, evidence=judge.Evidence())
        assert (row.status, row.verdict) == (status, status)
        assert row.metrics["max_abs_err"] == (1.0 if status == "pass" else 2.0)
        assert "Quantization API" in row.message
    # any other API's int8 output: not comparable in msprobe 8.3.3 (an error whatever the values)
    other = standards.compare_tensor("Torch.x.0.forward.output.0", bench, one_off, bench_dtype="torch.int8",
                                     device_dtype="torch.int8", judging=standards.Judging("abs", SPECS))
    assert other.status == "error" and "cannot compare" in other.message
    # int32 outputs of other APIs stay exact (binary consistency)
    exact = standards.compare_tensor("Torch.x.0.forward.output.0", bench.astype(np.int32), one_off.astype(np.int32),
                                     bench_dtype="torch.int32", device_dtype="torch.int32", judging=standards.Judging("abs", SPECS))
    assert exact.status == "error" and exact.metrics["binary_error_rate"] == 0.5


KERNELS = """
import torch
from bench_functions.quant import npu_dynamic_quant


def truncating(input, **kwargs):  # rounds towards zero: at most one step away from round-to-nearest
    scale = input.float().abs().amax(dim=-1) / 127
    return torch.trunc(input.float() / scale.unsqueeze(-1)).to(torch.int8), scale


def off_by_two(input, **kwargs):
    y, scale = npu_dynamic_quant(input, **kwargs)
    return (y.to(torch.int16) - 2).clamp(-128, 127).to(torch.int8), scale


ONE = {"NPU.npu_dynamic_quant": truncating}
TWO = {"NPU.npu_dynamic_quant": off_by_two}
"""


def test_dynamic_quant_is_judged_by_the_quantization_rule_end_to_end(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kern=KERNELS)
    x = tensor("torch.bfloat16", [16, 64], mx=3.0, mn=-3.0)
    data = {"NPU.npu_dynamic_quant.0.forward": {
        "input_args": [x], "input_kwargs": {},
        "output": [tensor("torch.int8", [16, 64], mx=127, mn=-127), tensor("torch.float32", [16])]}}
    dump = make_dump(pytester, data)
    pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:ONE", "--msprobe-out", "one",
                       *LEAN).assert_outcomes(passed=1)
    (rec,) = api_records(pytester, "one").values()
    y, scale = rec["outputs"]
    assert y["device_dtype"] == "torch.int8" and y["status"] == y["verdict"] == "pass"
    assert y["metrics"]["max_abs_err"] == 1.0  # truncation differs from rounding somewhere, by one step
    assert scale["status"] == "pass" and scale["device_dtype"] == "torch.float32"
    pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:TWO", "--msprobe-out", "two",
                       *LEAN).assert_outcomes(failed=1)
    (rec,) = api_records(pytester, "two").values()
    assert rec["outputs"][0]["metrics"]["max_abs_err"] == 2.0 and rec["outputs"][0]["verdict"] == "error"


def test_dynamic_quant_bench_quantises_per_row() -> None:
    from bench_functions.quant import npu_dynamic_quant

    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
    y, scale = npu_dynamic_quant(x, smooth_scales=torch.tensor([1.0, 1.0, 2.0]))
    assert scale.dtype == torch.float32 and torch.equal(scale, torch.tensor([2.0 / 127, 0.0]))
    assert y.dtype == torch.int8 and y.tolist() == [[64, -127, 64], [0, 0, 0]]


def test_fp8_ulp_errors_follow_the_tapered_format() -> None:
    from pytest_msprobe.metrics.vectorised import ulp_errors_fp8

    p = SPECS["thresholds"]["ulp_fp8_26x"]
    bench = np.array([1.0, 1.0, 0.001, 2.0 ** -20, -2.0 ** -20, 0.0])
    device = np.array([1.125, 0.75, 0.001 + 2.0 ** -11, 2.0 ** -19, -2.0 ** -18, 0.0])
    ulp = ulp_errors_fp8(bench, device, exponent_floor=p["exponent_floor"], mantissa_width=p["mantissa_width"])
    # e=0: width 3 -> 2**3 per unit; e=-10: width 1 -> 2**11; e=-20: width 0 -> log2 distance (sign-aware)
    np.testing.assert_allclose(ulp, [1.0, 2.0, 1.0, 1.0, 2.0, 0.0])


def test_fp8_outputs_get_26x_ulp_rule_without_a_reference() -> None:
    bench = np.linspace(1.0, 1.5, 64).astype(np.float32)
    for shift, verdict in ((0.125, "pass"), (0.25, "error")):  # one and two steps of e4m3 at [1, 2)
        row = standards.compare_tensor("Torch.clone.0.forward.output.0", bench, bench + shift,
                                       bench_dtype="torch.float8_e4m3fn", device_dtype="torch.float8_e4m3fn",
                                       judging=standards.Judging("clone", SPECS, "msprobe26"))
        judge.decide(row, "msprobe26", api_name="clone", specs=SPECS, evidence=judge.Evidence())
        assert row.algorithm == "ulp_compare" and row.verdict == verdict, row.verdict_message
        assert row.compare["ulp_status"] == verdict and row.metrics["max_ulp_err"] == shift * 8
    # msprobe 8.x has no fp8 rule: Layer 1 only, no Layer-2 columns
    row = standards.compare_tensor("Torch.clone.0.forward.output.0", bench, bench + 0.25,
                                   bench_dtype="torch.float8_e4m3fn", device_dtype="torch.float8_e4m3fn",
                                   judging=standards.Judging("clone", SPECS, "msprobe"))
    assert row.algorithm is None and row.metrics["max_ulp_err"] is None


FP8_KERNEL = """
import torch


def two_steps_up(x, *args, **kwargs):  # two e4m3 steps above the true value in [1, 1.5]
    return (x.float() + 0.25).to(x.dtype)


KERNELS = {"Torch.clone": two_steps_up}
"""


def test_fp8_rule_end_to_end(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kern=FP8_KERNEL)
    fp8 = tensor("torch.float8_e4m3fn", [8, 16], mx=1.5, mn=1.0)
    dump = make_dump(pytester, {"Torch.clone.0.forward": {"input_args": [fp8], "input_kwargs": {}, "output": [fp8]}})
    for standard, outcome in (("msprobe26", {"failed": 1}), ("msprobe", {"passed": 1})):
        result = pytester.runpytest(str(dump), "--msprobe-kernels", "kern.py:KERNELS", "--msprobe-standard", standard,
                                    "--msprobe-out", standard, *LEAN)
        result.assert_outcomes(**outcome)
        (out,) = next(iter(api_records(pytester, standard).values()))["outputs"]
        assert out["device_dtype"] == "torch.float8_e4m3fn"
        assert (out["algorithm"], out["verdict"]) == (("ulp_compare", "error") if standard == "msprobe26"
                                                      else (None, "pass"))
