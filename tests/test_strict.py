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


def _arrays(data, dtype: str, n: int) -> tuple[np.ndarray, ...]:
    """bench, device, reference, sensitivity with the shapes of real outputs: mostly near-rounded,
    some gross errors, long-reduction noise, zeros, subnormals and NaN/inf (shared or not)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    bench = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
    bench[rng.random(n) < 0.05] = 0.0
    bench[rng.random(n) < 0.01] = 1e-41
    device = strict.round_to(bench * (1 + rng.standard_normal(n) * data.draw(st.sampled_from([0, 1e-9, 1e-3]))), dtype)
    reference = strict.round_to(bench * (1 + rng.standard_normal(n) * data.draw(st.sampled_from([0, 1e-4]))), dtype)
    device[rng.random(n) < data.draw(st.sampled_from([0, 1e-3]))] *= 1.5
    if data.draw(st.booleans(), label="non-finite"):
        where = rng.random(n) < 0.02
        bench[where] = reference[where] = device[where] = rng.choice([np.nan, np.inf, -np.inf], int(where.sum()))
        if data.draw(st.booleans(), label="mismatch") and n:
            device[rng.integers(0, n)] = np.nan
    sensitivity = np.abs(bench) * rng.uniform(0, 1e-3, n) if data.draw(st.booleans()) else None
    return bench, device, reference, sensitivity


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES + ["torch.float64"]),
       n=st.sampled_from([1, 7, 64, 1000, 3 * 1024 + 5]), block=st.sampled_from([16, 1000, 1 << 15]),
       samples=st.sampled_from([50, 262144]))
def test_blocked_checks_agree_with_the_whole_array_oracle(data, dtype: str, n: int, block: int, samples: int) -> None:
    """Blocks, the partition-only quantile and the bit-level ULP change nothing but speed."""
    from unittest import mock

    from tests import strict_oracle

    with mock.patch.object(strict, "BLOCK", block):
        _agree(data, dtype, n, samples, strict_oracle)


def _agree(data, dtype: str, n: int, samples: int, strict_oracle) -> None:
    rules = {**RULES, "bias_max_samples": samples}
    bench, device, reference, sensitivity = _arrays(data, dtype, n)
    # the blocked version also takes the storage dtypes the check passes (fp32 for 16-bit values)
    storage = np.float32 if dtype != "torch.float64" else np.float64
    result = strict.strict_compare(bench, device.astype(storage), reference.astype(storage), dtype, rules,
                                   None if sensitivity is None else sensitivity.astype(np.float32))
    outcome, expected = strict_oracle.strict_stats(bench, device.astype(storage), reference.astype(storage), dtype,
                                                   rules, None if sensitivity is None else sensitivity.astype(np.float32))
    assert result.stats.keys() == expected.keys()
    for key, value in expected.items():
        assert result.stats[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert (outcome == "nonfinite") == ("NaN/inf mismatch" in result.message)


@pytest.mark.parametrize("dtype", DTYPES + ["torch.float64"])
def test_ulp_matches_frexp(dtype: str) -> None:
    from tests import strict_oracle

    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(10000) * 10.0 ** rng.integers(-60, 60, 10000),
                        [0.0, -0.0, 2.0 ** -130, 1e-310, 5e-324, 65504.0]])
    with np.errstate(over="ignore"):
        rounded = strict.round_to(x, dtype)
    for values in (x, rounded):
        finite = np.isfinite(values)
        assert np.array_equal(strict.ulp(values[finite], dtype), strict_oracle.ulp(values[finite], dtype))


def test_gross_message_names_the_worst_element_of_a_large_output() -> None:
    """The worst element is reported from the full output, not from the bias test's sample."""
    bench = np.linspace(1.0, 2.0, 300_000)
    device = strict.round_to(bench, "torch.float32")
    device[299_000] = 7.0
    result = strict.strict_compare(bench, device, strict.round_to(bench, "torch.float32"), "torch.float32", RULES)
    assert result.status == "error" and "at flat index 299000: device 7.0" in result.message
