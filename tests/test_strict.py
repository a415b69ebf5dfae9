"""The strict standard's checks on arrays: error model by kind of op, exactness, NaN/inf, bias, messages."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import grid, strict
from pytest_msprobe.verdict.judge import element_rules as _rules

THRESHOLDS = load_specs()["thresholds"]["strict"]
DTYPES = ["torch.float16", "torch.bfloat16", "torch.float32"]
KINDS = ["elementwise", "exact", "reduction", "contraction"]


def judge(bench, device, dtype, kind="elementwise", section=None, **extra):
    return strict.strict_compare(np.asarray(bench), np.asarray(device), dtype, _rules(THRESHOLDS, dtype, kind, section),
                                 kind=kind, **extra)


def ulps(values, dtype):
    return grid.ulp(grid.round_to(np.asarray(values, dtype=np.float64), dtype), dtype)


values = st.lists(st.floats(-1e4, 1e4, allow_nan=False, allow_subnormal=False), min_size=1, max_size=300)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), kind=st.sampled_from(KINDS), values=values)
def test_correctly_rounded_output_has_zero_error(dtype: str, kind: str, values: list[float]) -> None:
    bench = np.array(values)
    rounded = grid.round_to(bench, dtype)
    result = judge(bench, rounded, dtype, kind)
    assert result.status == "pass" and result.stats["max_err"] == 0.0


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), kind=st.sampled_from(["elementwise", "exact", "reduction"]), values=values,
       seed=st.integers(0, 2**32 - 1), spread=st.sampled_from([1, 3, 30]))
def test_a_device_equal_to_torchs_own_kernel_always_passes(dtype: str, kind: str, values: list[float], seed: int,
                                                            spread: int) -> None:
    """Whatever torch's own kernel loses (here: up to `spread` ULPs, at random), a device that loses
    exactly that is never flagged: the checks compare against it."""
    bench = np.array(values)
    rng = np.random.default_rng(seed)
    torch_run = grid.round_to(bench + rng.integers(-spread, spread + 1, bench.size) * ulps(bench, dtype), dtype)
    assert judge(bench, torch_run, dtype, kind, torch_run=torch_run).status == "pass"


@pytest.mark.parametrize("dtype", DTYPES)
def test_truncation_of_an_exact_operation_fails_even_on_three_elements(dtype: str) -> None:
    bench = np.array([1 / 3, -2 / 3, 0.1, 0.7, -1.3, 2.9])
    rounded = grid.round_to(bench, dtype)
    truncated = np.where(np.abs(rounded) > np.abs(bench), rounded - np.sign(bench) * ulps(bench, dtype), rounded)
    assert not np.array_equal(truncated, rounded)
    result = judge(bench, truncated, dtype, "exact", torch_run=rounded)
    assert result.status == "error" and "not correctly rounded" in result.message
    assert judge(bench, truncated, dtype, "elementwise", torch_run=rounded).status == "pass"  # within its ULP


def _at_ties(dtype: str, n: int, picked: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A bench with the picked elements exactly halfway between two neighbours of the dtype, and its
    correct rounding."""
    bench = grid.round_to(rng.standard_normal(n), dtype)
    bench = np.where(picked, bench + 0.5 * grid.ulp(bench, dtype), bench)
    return bench, grid.round_to(bench, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_few_wrongly_rounded_elements_fail_when_they_all_lean_one_way(dtype: str) -> None:
    """With a Python scalar operand a few elements may round otherwise than torch at a tie, but not all
    one way: truncation of 0.3% of the elements (below the count limit) fails."""
    rng = np.random.default_rng(2)
    picked = rng.random(1 << 16) < 0.003
    assert picked.mean() < THRESHOLDS["exact_scalar"]["exact_max_fraction"]
    bench, rounded = _at_ties(dtype, picked.size, picked, rng)
    step = grid.ulp(rounded, dtype)
    toward_zero = np.where(picked & (np.abs(rounded) > np.abs(bench)), rounded - np.sign(rounded) * step, rounded)
    result = judge(bench, toward_zero, dtype, "exact", "exact_scalar", torch_run=rounded)
    assert result.status == "error" and "sign test" in result.message and "toward zero" in result.message
    # at the same ties, the other neighbour either way: a kernel with its own rounding of the scalar
    other = np.where(picked, np.where(rounded > bench, rounded - step, rounded + step), rounded)
    either_way = np.where(rng.random(picked.size) < 0.5, other, rounded)
    assert judge(bench, either_way, dtype, "exact", "exact_scalar", torch_run=rounded).status == "pass"


@pytest.mark.parametrize("dtype", DTYPES)
def test_between_tensors_one_wrongly_rounded_element_fails(dtype: str) -> None:
    """+-*/ and sqrt of tensors have one correct result (the benches compute it exactly enough): a single
    element that is neither it nor torch's fails. With a scalar operand one at a tie is allowed, and for
    16-bit outputs one away from a tie is not."""
    rng = np.random.default_rng(3)
    picked = np.zeros(4096, dtype=bool)
    picked[100] = True
    bench, rounded = _at_ties(dtype, picked.size, picked, rng)
    step = grid.ulp(rounded, dtype)
    at_tie = np.where(picked, np.where(rounded > bench, rounded - step, rounded + step), rounded)
    assert judge(bench, at_tie, dtype, "exact", torch_run=rounded).status == "error"
    assert judge(bench, at_tie, dtype, "exact", "exact_scalar", torch_run=rounded).status == "pass"
    off_tie = rounded.copy()
    off_tie[200] += step[200]
    off = judge(bench, off_tie, dtype, "exact", "exact_scalar", torch_run=rounded)
    assert off.status == ("pass" if dtype == "torch.float32" else "error")  # fp32: every element is near a tie


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16"])
def test_truncation_of_a_large_output_is_a_bias(dtype: str) -> None:
    rng = np.random.default_rng(0)
    bench = rng.standard_normal(64 * 256)
    rounded = grid.round_to(bench, dtype)
    truncated = np.where(np.abs(rounded) > np.abs(bench), rounded - np.sign(bench) * ulps(bench, dtype), rounded)
    result = judge(bench, truncated, dtype, "elementwise", torch_run=rounded, row=256)
    assert result.status == "error" and "biased towards zero" in result.message
    assert result.stats["bias_zero"] > 0.2 and result.stats["bias_zero_t"] > THRESHOLDS["bias_t"]


@pytest.mark.parametrize("rows", [4, 2048])
def test_the_bias_test_of_a_large_output_samples_enough_rows(rows: int) -> None:
    """Over bias_max_samples elements the test looks at some blocks only, but always at bias_min_groups
    rows or more: truncation in four rows of a million elements each is still found."""
    rng = np.random.default_rng(1)
    bench = rng.standard_normal(4 << 20).astype(np.float32)
    assert bench.size > 4 * THRESHOLDS["bias_max_samples"]
    rounded = grid.round_to(bench, "torch.bfloat16", work=np.float32)
    truncated = np.where(np.abs(rounded) > np.abs(bench), rounded - np.sign(bench) * grid.ulp(bench, "torch.bfloat16"),
                         rounded).astype(np.float32)
    row = bench.size // rows
    result = judge(bench, truncated, "torch.bfloat16", "elementwise", torch_run=rounded, row=row)
    assert result.status == "error" and "biased towards zero" in result.message
    assert judge(bench, rounded, "torch.bfloat16", "elementwise", torch_run=rounded, row=row).status == "pass"


def contraction(k: int, dtype: str, seed: int = 0):
    """bench (fp64), magnitude, and the results of an fp32-accumulating and a 16-bit-accumulating kernel."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    low = {"torch.float16": torch.float16, "torch.bfloat16": torch.bfloat16}[dtype]
    x, w = torch.randn(32, k, generator=gen).to(low), torch.randn(k, 48, generator=gen).to(low)
    bench = (x.double() @ w.double()).numpy()
    magnitude = (x.double().abs() @ w.double().abs()).numpy()
    split = sum(x[:, i:i + k // 4].float() @ w[i:i + k // 4].float() for i in range(0, k, k // 4))
    acc = torch.zeros(32, 48, dtype=low)
    for i in range(0, k, 16):
        acc = (acc.float() + x[:, i:i + 16].float() @ w[i:i + 16].float()).to(low)
    return bench, magnitude, split.to(low).double().numpy(), acc.double().numpy()


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16"])
@pytest.mark.parametrize("k", [256, 2048])
def test_contractions_are_judged_against_the_size_of_their_terms(dtype: str, k: int) -> None:
    bench, magnitude, split_k, low_accumulation = contraction(k, dtype)
    assert judge(bench, split_k, dtype, "contraction", magnitude=magnitude, row=48).status == "pass"
    result = judge(bench, low_accumulation, dtype, "contraction", magnitude=magnitude, row=48)
    assert result.status == "error", result.stats


def test_a_reduction_element_is_judged_against_its_row() -> None:
    """A cancelled element of a row (tiny value, normal-size terms) may carry the error of its row."""
    rng = np.random.default_rng(1)
    bench = rng.standard_normal((64, 128))
    bench[:, 5] = 1e-6  # cancelled
    torch_run = grid.round_to(bench * (1 + rng.uniform(-2, 2, bench.shape) * 2**-9), "torch.bfloat16")
    device = grid.round_to(bench * (1 + rng.uniform(-2, 2, bench.shape) * 2**-9), "torch.bfloat16")
    device[:, 5] = bench[:, 5] + 2**-9  # absolute error of the row's size, thousands of its own ULPs
    assert judge(bench, device, "torch.bfloat16", "reduction", torch_run=torch_run, row=128).status == "pass"
    result = judge(bench, device, "torch.bfloat16", "elementwise", torch_run=torch_run, row=128)
    assert result.status == "error" and "gross error" in result.message


def test_a_few_gross_elements_among_many_fail_and_the_message_names_the_worst() -> None:
    rng = np.random.default_rng(2)
    bench = rng.standard_normal(200_000)
    bench[123_456] = 1.7
    device = grid.round_to(bench, "torch.bfloat16")
    device[123_456] *= 1.05
    result = judge(bench, device, "torch.bfloat16", "reduction", torch_run=grid.round_to(bench, "torch.bfloat16"),
                   row=1000)
    assert result.status == "error"
    assert "gross error: 1 of 200000 elements" in result.message and "flat index 123456" in result.message


def test_nan_and_inf_are_compared_by_position_and_sign() -> None:
    bench = np.array([1.0, np.nan, -np.inf, 2.0])
    assert judge(bench, bench.copy(), "torch.float32").status == "pass"
    moved = judge(bench, np.array([1.0, 2.0, -np.inf, np.nan]), "torch.float32")
    assert moved.status == "error" and "NaN/inf mismatch at 2 of 4" in moved.message
    sign = judge(bench, np.array([1.0, np.nan, np.inf, 2.0]), "torch.float32")
    assert sign.status == "error"


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), kind=st.sampled_from(KINDS), values=values, seed=st.integers(0, 2**32 - 1),
       planted=st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), min_size=1, max_size=5))
def test_matching_nonfinite_elements_leave_the_verdict_of_the_others(dtype: str, kind: str, values: list[float],
                                                                     seed: int, planted: list[float]) -> None:
    """NaN and inf where the bench has them too are dropped: the rest is judged as if they were not there."""
    rng = np.random.default_rng(seed)
    bench = np.array(values)
    device = grid.round_to(bench + rng.integers(-2, 3, bench.size) * ulps(bench, dtype), dtype)
    at = rng.choice(bench.size + len(planted), len(planted), replace=False)
    keep = np.ones(bench.size + len(planted), bool)
    keep[at] = False
    full_bench, full_device = np.empty(keep.size), np.empty(keep.size)
    full_bench[keep], full_device[keep] = bench, device
    full_bench[at] = full_device[at] = planted
    alone, among = judge(bench, device, dtype, kind), judge(full_bench, full_device, dtype, kind)
    assert among.status == alone.status and among.message.split("(")[0] == alone.message.split("(")[0]
    assert among.stats == alone.stats  # every statistic, the mismatch count (0) included


def test_an_overflow_torch_shares_is_inherent() -> None:
    bench = np.array([1.0, 65000.0, 2.0])  # rounds to a finite fp16 value
    device = np.array([1.0, np.inf, 2.0])  # an intermediate overflowed
    assert judge(bench, device, "torch.float16", torch_run=device.copy()).status == "pass"
    assert judge(bench, device, "torch.float16", torch_run=np.array([1.0, 65024.0, 2.0])).status == "error"


def test_a_product_rounded_before_its_bias_is_allowed() -> None:
    """A sound kernel may round the product, then add the bias: the product's own ULP is the scale."""
    product = np.array([100.3, -50.7, 20.1])
    bias = np.array([-100.0, 50.5, -20.0])
    bench = product + bias
    device = grid.round_to(grid.round_to(product, "torch.bfloat16") + bias, "torch.bfloat16")
    magnitude = np.abs(product) * 4 + np.abs(bias)
    assert judge(bench, device, "torch.bfloat16", "contraction", magnitude=magnitude).status == "error"
    assert judge(bench, device, "torch.bfloat16", "contraction", magnitude=magnitude, product=product).status == "pass"


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16", "torch.float32", "torch.float64"])
def test_ulp_matches_frexp(dtype: str) -> None:
    mantissa, emin = {"torch.float16": (10, -14), "torch.bfloat16": (7, -126), "torch.float32": (23, -126),
                      "torch.float64": (52, -1022)}[dtype]
    x = np.array([1.0, 1.5, 3.0, 0.75, 2.0**-20, 1e4, -7.0])
    _, exponent = np.frexp(x)
    expected = np.maximum(2.0 ** (exponent - 1), 2.0**emin) * 2.0**-mantissa
    assert np.array_equal(grid.ulp(x, dtype), expected)
    if dtype != "torch.float64":  # float32 arrays (16-bit outputs are judged in float32): the same spacing
        assert np.array_equal(grid.ulp(x.astype(np.float32), dtype), expected.astype(np.float32))


def test_thresholds_by_kind_and_dtype() -> None:
    assert _rules(THRESHOLDS, "torch.bfloat16", "reduction")["gross"] == THRESHOLDS["reduction"]["gross"]
    assert _rules(THRESHOLDS, "torch.float32", "contraction")["mean_slack"] == THRESHOLDS["torch.float32"]["mean_slack"]
    assert _rules(THRESHOLDS, "torch.bfloat16", "elementwise")["gross"] == THRESHOLDS["gross"]
    # a kind's own per-dtype entry: fp32 reductions only
    assert _rules(THRESHOLDS, "torch.float32", "reduction")["gross"] == THRESHOLDS["reduction"]["torch.float32"]["gross"]
    assert _rules(THRESHOLDS, "torch.float32", "elementwise")["gross"] == THRESHOLDS["gross"]
    assert "torch.float32" not in _rules(THRESHOLDS, "torch.float32", "reduction")


def test_a_cancelled_row_below_the_fp32_benchs_resolution_is_not_judged() -> None:
    """Flash-style attention's dQ of a query row with one key is exactly 0; an fp32 bench leaves rounding
    noise there (1e-11 against gradients of 1e-4), and torch's kernel keeps that noise."""
    rng = np.random.default_rng(3)
    bench = (rng.standard_normal((64, 128)) * 3e-4).astype(np.float32)
    bench[0] = (rng.standard_normal(128) * 1.4e-11).astype(np.float32)  # a cancelled row: fp32 noise
    torch_run = grid.round_to(bench.astype(np.float64), "torch.bfloat16")
    device = torch_run.copy()
    device[0] = 0.0
    assert judge(bench, device, "torch.bfloat16", "reduction", torch_run=torch_run, row=128).status == "pass"
    device[1, 5] *= 1.05  # a real error elsewhere still fails
    assert judge(bench, device, "torch.bfloat16", "reduction", torch_run=torch_run, row=128).status == "error"


def test_attention_gradients_get_their_own_thresholds() -> None:
    specs = load_specs()
    assert "scaled_dot_product_attention" in specs["error_model"]["gradient_rounding"]
    rules = _rules(THRESHOLDS, "torch.bfloat16", "reduction", "gradient_rounding")
    assert rules["gross"] == THRESHOLDS["gradient_rounding"]["gross"] > _rules(THRESHOLDS, "torch.bfloat16",
                                                                               "reduction")["gross"]


TINY = {"torch.float16": 2.0**-14, "torch.bfloat16": 2.0**-126, "torch.float32": 2.0**-126}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_subnormal_result_flushed_to_zero_is_not_an_error(dtype: str, kind: str) -> None:
    """Flush-to-zero (NPUs, GPUs, the CPU's bf16 matmul: 0.0 where the bench is 1.47e-39) passes, of
    either sign and however many elements; a zero where the bench is normal, or a subnormal of the
    wrong sign, still fails."""
    rng = np.random.default_rng(3)
    bench = rng.standard_normal(4096) * TINY[dtype]  # a third of it below the normal range
    rounded = grid.round_to(bench, dtype)
    flushed = np.where(np.abs(bench) < TINY[dtype], np.copysign(0.0, bench * rng.choice([-1, 1], bench.size)), rounded)
    assert np.count_nonzero(flushed != rounded) > 1000, np.count_nonzero(flushed != rounded)
    result = judge(bench, flushed, dtype, kind, row=64)
    assert result.status == "pass", result.message
    assert result.stats["max_err"] == 0.0
    # torch's own kernel flushing where the device does not changes nothing either
    assert judge(bench, rounded, dtype, kind, row=64, torch_run=flushed if kind != "contraction" else None).status == \
        "pass"
    normal = bench.copy()
    normal[2048] = 1.5 * TINY[dtype]
    device = np.where(np.abs(normal) < TINY[dtype], 0.0, grid.round_to(normal, dtype))
    device[2048] = 0.0
    wrong = judge(normal, device, dtype, kind, row=64)
    assert wrong.status == "error" and "flat index 2048" in wrong.message
    signed = rounded.copy()
    signed[7] = -signed[7]
    assert signed[7] != 0.0
    assert judge(bench, signed, dtype, "elementwise", row=64).status == "error"


@pytest.mark.parametrize("factor, direction", [(1 + 1e-3, "away from zero"), (1 - 1e-3, "towards zero")])
def test_the_message_gives_every_number_its_unit_and_the_bias_its_true_direction(factor: float,
                                                                                 direction: str) -> None:
    """fp32 linear output times 1 +- 1e-3: farther from zero is *away from* zero; the gross and
    mean figures are in scale units (the worst element also in ULPs), the bias in ULPs clipped to +-1."""
    bench, magnitude, _, _ = contraction(64, "torch.bfloat16")
    device = grid.round_to(bench * factor, "torch.float32")
    result = judge(bench, device, "torch.float32", "contraction", magnitude=magnitude, row=48)
    worst = result.stats["max_err"]
    assert re.search(rf"gross error: \d+ of 1536 elements exceed 4 scale units \(worst {worst:.3g} scale units = "
                     r"[\d.e+]+ ULP, at flat index \d+: device [-\d.e]+, bench [-\d.e]+\)", result.message), result.message
    assert f"mean error: {result.stats['mean_err']:.3g} > limit " in result.message
    assert "(correctly rounded: 0), in scale units" in result.message  # no torch run: the ideal kernel stands in
    assert f"bias: errors biased {direction}: 1 ULP on average, each error clipped to ±1 ULP" in result.message
    other = "towards zero" if direction == "away from zero" else "away from zero"
    assert f"biased {other}" not in result.message
    assert np.sign(result.stats["bias_zero"]) == (1 if direction == "towards zero" else -1)


@pytest.mark.parametrize("step, direction", [(1, "upward"), (-1, "downward")])
def test_a_shift_in_one_direction_is_named_by_its_direction(step: int, direction: str) -> None:
    rng = np.random.default_rng(5)
    bench = rng.standard_normal(64 * 64)
    rounded = grid.round_to(bench, "torch.bfloat16")
    shifted = rounded + step * np.where(rng.random(bench.size) < 0.5, ulps(bench, "torch.bfloat16"), 0.0)
    result = judge(bench, shifted, "torch.bfloat16", torch_run=rounded, row=64)
    assert result.status == "error" and f"errors biased {direction}: " in result.message, result.message
    assert "(limit 0.0" in result.message and " ULP; torch run: " in result.message


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_correctly_rounded_output_of_repeated_values_is_not_biased(dtype: str) -> None:
    """Fuzzing found it (fp32 gelu computed in fp64, the recorded Min's neighbour repeated): the correctly
    rounded result's own rounding error, shared by repeated values, read as 'errors biased upward'."""
    rng = np.random.default_rng(7)
    bench = np.where(rng.random(64 * 64) < 0.7, 1 / 3 + 1e-9, rng.standard_normal(64 * 64))
    rounded = grid.round_to(bench, dtype)
    assert abs(float((rounded[0] - bench[0]) / ulps(bench[:1], dtype)[0])) > 0.1  # a sizeable rounding error
    torch_run = grid.round_to(bench + rng.choice([-1, 0, 0, 1], bench.size) * ulps(bench, dtype), dtype)
    result = judge(bench, rounded, dtype, torch_run=torch_run, row=64)
    assert result.status == "pass", result.message
    assert result.stats["bias"] == 0.0 and result.stats["bias_zero"] == 0.0


def _rows_with_noise(rng: np.random.Generator, bench: np.ndarray, dtype: str, per_row: float) -> np.ndarray:
    """bench rounded after a relative error of about a third of an ULP per element (independent), plus one
    shared by each row of about `per_row` ULP (a row statistic such as rstd computed in low precision)."""
    unit = 2.0 ** -8
    element = rng.uniform(-0.6, 0.6, bench.shape) * unit
    row = rng.normal(0, per_row * unit, (bench.shape[0], 1))
    return grid.round_to(bench * (1 + element + row), dtype)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_errors_shared_by_whole_rows_fail_a_norm_and_independent_ones_pass(seed: int) -> None:
    """RMSNorm's mean of squares in bf16 scales each row of its gradient by its own error (about 0.35 ULP):
    the mean error stays near a sound kernel's, the spread over rows of the mean error towards zero does not."""
    specs = load_specs()
    assert "npu_rms_norm" in specs["error_model"]["row_statistic"]
    rng = np.random.default_rng(seed)
    dtype = "torch.bfloat16"
    bench = rng.normal(size=(128, 256))
    torch_run = _rows_with_noise(rng, bench, dtype, 0.0)
    sound = _rows_with_noise(rng, bench, dtype, 0.0)
    buggy = _rows_with_noise(rng, bench, dtype, 0.35)
    args = {"torch_run": torch_run, "row": 256}
    assert judge(bench, sound, dtype, "reduction", "row_statistic", **args).status == "pass"
    got = judge(bench, buggy, dtype, "reduction", "row_statistic", **args)
    assert got.status == "error" and got.message.startswith("row error: "), got.message
    assert got.stats["row_spread"] > 3 * got.stats["ref_row_spread"]
    # only the norms listed get the check: the other checks alone pass this kernel
    assert judge(bench, buggy, dtype, "reduction", **args).status == "pass"
