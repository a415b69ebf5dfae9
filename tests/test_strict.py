"""The strict standard: targets on planted bugs, representation awareness, NaN/inf positions."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_msprobe import strict
from pytest_msprobe.specs import load_specs
from tests.planted_bugs import beyond_rounding, cases

RULES = load_specs()["thresholds"]["strict"]
DTYPES = ["torch.float16", "torch.bfloat16", "torch.float32"]


@pytest.fixture(scope="module")
def planted() -> list:
    return list(cases(seed=11))


def test_no_false_alarm_on_correct_kernels(planted) -> None:
    correct = [c for c in planted if not c.is_bug]
    assert len(correct) >= 40
    alarms = [(c.api, c.dtype, c.kind, strict.strict_compare(c.bench, c.device, c.reference, c.dtype, RULES,
                                                              c.sensitivity).message)
              for c in correct
              if strict.strict_compare(c.bench, c.device, c.reference, c.dtype, RULES, c.sensitivity).status != "pass"]
    assert alarms == []


def test_catches_95_percent_of_bugs_beyond_rounding(planted) -> None:
    reference_kernels = {(c.api, c.dtype, c.bench.shape): c.device for c in planted if c.kind == "correct:torch"}
    bugs = [c for c in planted if c.is_bug and beyond_rounding(c, reference_kernels[(c.api, c.dtype, c.bench.shape)])]
    assert len(bugs) >= 40
    missed = [(c.api, c.dtype, c.kind) for c in bugs
              if strict.strict_compare(c.bench, c.device, c.reference, c.dtype, RULES, c.sensitivity).status == "pass"]
    assert len(missed) <= 0.05 * len(bugs), missed


@pytest.mark.parametrize("kind", ["bug:truncate", "bug:half-accumulation", "bug:corrupt-1e-4", "bug:drops-nan"])
def test_each_planted_bug_kind_is_caught_in_every_dtype(planted, kind: str) -> None:
    for case in (c for c in planted if c.kind == kind):
        result = strict.strict_compare(case.bench, case.device, case.reference, case.dtype, RULES, case.sensitivity)
        assert result.status == "error", (case.api, case.dtype)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), values=st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=300))
def test_correctly_rounded_output_has_zero_error(dtype: str, values: list[float]) -> None:
    bench = np.array(values)
    rounded = strict.round_to(bench, dtype)
    result = strict.strict_compare(bench, rounded, rounded, dtype, RULES)
    assert result.status == "pass" and result.stats["max_err"] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_to_and_ulp_match_torch(dtype: str) -> None:
    torch_dtype = getattr(torch, dtype[6:])
    x = (torch.randn(10000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 1000).float().double()
    x[:3] = torch.tensor([0.0, 1e-30, 65519.0])  # fp32-exact values: no double-rounding ties between paths
    assert np.array_equal(strict.round_to(x.numpy(), dtype), x.to(torch.float32).to(torch_dtype).double().numpy()
                          if dtype == "torch.bfloat16" else x.to(torch_dtype).double().numpy())
    y = x.to(torch_dtype)
    up = torch.nextafter(y.float().abs(), torch.tensor(math.inf)).to(torch_dtype) if dtype == "torch.bfloat16" else \
        torch.nextafter(y.abs(), torch.tensor(math.inf, dtype=torch_dtype))
    spacing = (up.double() - y.abs().double()).numpy()
    finite = np.isfinite(spacing) & (spacing > 0) & (y.abs().double().numpy() > 0)
    ours = strict.ulp(y.double().numpy(), dtype)
    if dtype == "torch.bfloat16":  # nextafter in fp32 then bf16 rounding is not bf16 nextafter; check powers of two
        assert strict.ulp(np.array([1.0, 3.0, 2.0 ** -130]), dtype).tolist() == [2.0 ** -7, 2.0 ** -6, 2.0 ** -133]
    else:
        assert np.array_equal(ours[finite], spacing[finite])


def test_nan_and_inf_are_compared_by_position() -> None:
    bench = np.array([1.0, np.nan, np.inf, -2.0])
    ok = strict.strict_compare(bench, bench.copy(), bench.copy(), "torch.float32", RULES)
    assert ok.status == "pass"
    moved = np.array([np.nan, 1.0, np.inf, -2.0])
    result = strict.strict_compare(bench, moved, bench, "torch.float32", RULES)
    assert result.status == "error" and "NaN/inf mismatch at 2 of 4" in result.message
    sign = strict.strict_compare(bench, np.array([1.0, np.nan, -np.inf, -2.0]), bench, "torch.float32", RULES)
    assert sign.status == "error"


def test_overflow_shared_with_the_reference_is_not_a_bug() -> None:
    bench = np.array([65519.9, 1.0])  # rounds to inf in fp16 only via the fp32 path of some kernels
    device = np.array([np.inf, 1.0])
    assert strict.strict_compare(bench, device, device, "torch.float16", RULES).status == "pass"


def test_a_few_gross_elements_among_many_fail() -> None:
    rng = np.random.default_rng(0)
    bench = rng.uniform(0.5, 2.0, 100_000)
    device = strict.round_to(bench, "torch.bfloat16")
    device[12345] *= 1.1
    result = strict.strict_compare(bench, device, strict.round_to(bench, "torch.bfloat16"), "torch.bfloat16", RULES)
    assert result.status == "error" and "1 of 100000 elements" in result.message
