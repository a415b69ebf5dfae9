"""The strict checks in torch ops (verdict/strict_torch.py, msprobe_checks_on=device) against the numpy
oracle (tests/strict_oracle.py) and the compiled host pass, on the CPU through the same code path an
accelerator runs: the same verdicts and messages, the statistics equal within TOLERANCE (the sums are
added in torch's order, not numpy's pairwise one)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from pytest_msprobe.check.compare import checks_device
from pytest_msprobe.metrics.on_device import SUMMED_COLUMNS
from pytest_msprobe.settings import CheckOptions
from pytest_msprobe.verdict import strict, strict_torch
from pytest_msprobe.verdict.judge import element_rules as _rules

from .helpers import EXAMPLES, by_api, copy_dump, device_side_conftest, records
from .strict_oracle import numpy_strict
from .test_strict_kernel import CASES, DTYPES, KINDS, THRESHOLDS, _device_side, strict_case

# relative, on sums, means and t statistics: far below the 3 significant digits of a message and any margin
# a verdict is taken with (the sums of a few million terms in another order differ by about 1e-13)
TOLERANCE = 1e-9


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-300)


def agree(device: strict.StrictResult, host: strict.StrictResult) -> bool:
    """The same status and message, every statistic within TOLERANCE (a t statistic of groups whose means all
    but agree is the ratio of two roundings: any two values of it past the bias limit count as equal)."""
    if device.status != host.status or device.message != host.message or device.stats.keys() != host.stats.keys():
        return False
    for key, value in host.stats.items():
        other = device.stats[key]
        if key.endswith("_t") and min(abs(value), abs(other)) > 1e6:
            continue
        if not _close(other, value):
            return False
    return True


def on_torch(bench: np.ndarray, device: np.ndarray, dtype: str, kind: str, row: int = 1,
             **extra: Any) -> tuple[strict.StrictResult, strict.StrictResult, strict.StrictResult]:
    """(torch pass on CPU tensors, numpy oracle, compiled pass) of the same arrays."""
    rules = _rules(THRESHOLDS, dtype, kind)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in extra.items()}
    result = strict.strict_compare(torch.from_numpy(np.ascontiguousarray(bench)),
                                   torch.from_numpy(np.ascontiguousarray(device)), dtype, rules, kind=kind, row=row,
                                   **tensors)
    with numpy_strict():
        oracle = strict.strict_compare(bench, device, dtype, rules, kind=kind, row=row, **extra)
    return result, oracle, strict.strict_compare(bench, device, dtype, rules, kind=kind, row=row, **extra)


@settings(max_examples=300, deadline=None)
@given(**CASES)
def test_the_torch_pass_agrees_with_the_oracle(dtype: str, kind: str, values: list[float], seed: int, spread: int,
                                               third: str, product: bool, bench64: bool, row: int,
                                               zero_d: bool) -> None:
    """NaN, inf, subnormals of every format, empty and 0-d outputs, each kind and third run."""
    bench, device, extra = strict_case(dtype, values, seed, spread, third, product, bench64, row, zero_d)
    result, oracle, compiled = on_torch(bench, device, dtype, kind, **extra)
    assert agree(result, oracle), (result, oracle)
    assert agree(result, compiled)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_many_blocks_and_chunks_agree(dtype: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs of many of strict's blocks in several chunks (a short last one), rows longer than a block,
    the bias test sampling every few blocks, planted errors: the same verdicts, messages and statistics."""
    monkeypatch.setitem(strict_torch.CHUNK, "cpu", 1 << 17)  # several chunks, each of whole blocks
    rng = np.random.default_rng(11)
    n = 300_000
    bench = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(
        np.float64 if dtype in ("torch.float32", "torch.float64") else np.float32)
    device, torch_run = _device_side(rng, bench, dtype, 2), _device_side(rng, bench, dtype, 1)
    wrong = device.copy()
    with np.errstate(over="ignore"):
        wrong[rng.random(n) < 0.001] *= 1.5  # gross errors, wrongly rounded elements
    for row, extra in ((12_000, {"torch_run": torch_run}), (1000, {"magnitude": np.abs(bench) * 3}), (7, {}),
                       (50_000, {"torch_run": torch_run, "estimated": rng.random(n) < 0.1, "product": device})):
        for side in (device, wrong):
            result, oracle, _ = on_torch(bench, side, dtype, kind, row=row, **extra)
            assert agree(result, oracle), (row, extra.keys(), result, oracle)
    assert on_torch(bench, wrong, dtype, kind, row=7)[0].status == "error"


@pytest.mark.parametrize("dtype", DTYPES)
def test_subnormals_ties_and_overflow_round_as_numpy_does(dtype: str) -> None:
    """A sweep of float32 bit patterns, the device equal to numpy's rounding: zero error on both paths."""
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    bench = bits.view(np.float32)
    bench = bench[np.isfinite(bench)]
    device = _device_side(np.random.default_rng(0), bench, dtype, 0)
    result, oracle, _ = on_torch(bench, device, dtype, "exact")
    assert agree(result, oracle), (result, oracle)


def test_flushed_zeros_and_16_bit_tensors_as_they_live_on_a_device() -> None:
    """A bf16 device output and torch run (as they come from the API, not widened) with flushed subnormals."""
    rng = np.random.default_rng(5)
    bench = (rng.standard_normal(20_000) * 2.0 ** -126 * np.where(rng.random(20_000) < 0.5, 0.3, 3.0)).astype(
        np.float32)
    device, torch_run = _device_side(rng, bench, "torch.bfloat16", 1), _device_side(rng, bench, "torch.bfloat16", 1)
    device[rng.random(device.size) < 0.3] = 0.0
    rules = _rules(THRESHOLDS, "torch.bfloat16", "reduction")
    host = strict.strict_compare(bench, device, "torch.bfloat16", rules, kind="reduction", row=100, torch_run=torch_run)
    result = strict.strict_compare(torch.from_numpy(bench), torch.from_numpy(device).bfloat16(), "torch.bfloat16",
                                   rules, kind="reduction", row=100, torch_run=torch.from_numpy(torch_run).bfloat16())
    assert agree(result, host), (result, host)


def test_the_parameters_are_read_in_the_compiled_pass_order() -> None:
    from pytest_msprobe.verdict import strict_kernel as K

    assert (strict_torch.P_FLOOR, strict_torch.P_TORCH, strict_torch.P_ROW, strict_torch.P_EST, strict_torch.P_ACC,
            strict_torch.P_GROSS, strict_torch.P_EMIN, strict_torch.P_ULP, strict_torch.P_WINDOW) == \
        (K.P_FLOOR, K.P_TORCH, K.P_ROW, K.P_EST, K.P_ACC, K.P_GROSS, K.P_EMIN, K.P_ULP, K.P_WINDOW)


def test_where_the_checks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: the host for CPU outputs; device: where the device output lives; host: always the host; only the
    strict standard has a torch pass."""
    outputs, meta = [torch.zeros(3), 1.0], [torch.zeros(3, device="meta")]
    assert checks_device(CheckOptions(checks_on="auto"), outputs, None) is None
    assert checks_device(CheckOptions(checks_on="device"), outputs, None) == torch.device("cpu")
    assert checks_device(CheckOptions(checks_on="host"), outputs, None) is None
    assert checks_device(CheckOptions(checks_on="device", standard="msprobe"), outputs, None) is None
    # a reference run's device counts where the device output has none
    assert checks_device(CheckOptions(checks_on="device"), [1.0], meta) == torch.device("meta")
    # an accelerator's output, or its reference run beside a CPU device output (--msprobe-reference cuda): auto
    # runs the checks there; `meta` stands in for cuda here
    monkeypatch.setattr("pytest_msprobe.check.compare.ACCELERATORS", ("meta",))
    assert checks_device(CheckOptions(), meta, None) == torch.device("meta")
    assert checks_device(CheckOptions(), outputs, meta) == torch.device("meta")
    assert checks_device(CheckOptions(checks_on="host"), outputs, meta) is None
    monkeypatch.undo()
    if torch.cuda.is_available():
        on = [torch.zeros(3, device="cuda")]
        assert checks_device(CheckOptions(checks_on="auto"), on, None) == on[0].device
        assert checks_device(CheckOptions(checks_on="auto"), outputs, on) == on[0].device


# the device truncates gelu and drops the low bits of linear's result, so that some items fail
_PLANTED = device_side_conftest("""
    import torch
    import torch.nn.functional as F

    def truncated(orig, *a, **k):  # computed in fp32, then truncated (not rounded) to bf16
        wide = orig(*[x.float() if isinstance(x, torch.Tensor) else x for x in a], **k)
        return (wide.view(torch.int32) & -65536).view(torch.float32).to(a[0].dtype)

    IMPLS = {F.gelu: truncated, F.linear: truncated}
""")


# msprobe's columns taken from a sum: on the device a float64 sum in torch's order, on the host numpy's pairwise sum
# in float32 for 16-bit outputs (metrics/on_device.py): they agree within a float32 sum's rounding
SUMMED_TOLERANCE = 1e-6


def _comparable(record: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, float]], list[dict[str, float]]]:
    """A record without its timings; its outputs' strict statistics apart (compared within TOLERANCE), and
    msprobe's columns taken from a sum (within SUMMED_TOLERANCE)."""
    record = {k: v for k, v in record.items() if k != "timings"}
    stats = [output.pop("reference", None) or {} for output in record["outputs"]]
    summed = [{k: output["metrics"].pop(k) for k in SUMMED_COLUMNS if output["metrics"].get(k) is not None}
              for output in record["outputs"]]
    return record, stats, summed


@pytest.mark.parametrize("workers", [[], ["-n", "2", "-o", "msprobe_min_work_per_worker=0"]])
def test_a_run_with_the_checks_on_the_device_writes_the_records_of_the_host_run(
        pytester: pytest.Pytester, workers: list[str]) -> None:
    """End to end on a small bf16 dump with planted bugs, every kind of op, forward and backward: the same
    outcomes, and records equal but for the strict statistics, which agree within TOLERANCE."""
    pytester.makeconftest(_PLANTED)
    dump = copy_dump(pytester, EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0", "mlp")
    runs = {}
    for where in ("host", "device"):
        result = pytester.runpytest(str(dump), "--msprobe-device", "cpu", "-o", f"msprobe_checks_on={where}",
                                    "--msprobe-out", where, "-p", "no:cacheprovider", *workers)
        runs[where] = (result.parseoutcomes(), by_api(records(pytester, where)))
    (host_outcomes, host), (device_outcomes, device) = runs["host"], runs["device"]
    assert host_outcomes == device_outcomes and host_outcomes.get("failed", 0) >= 2, host_outcomes
    assert host.keys() == device.keys() and len(host) >= 15
    judged = summed = 0
    for name in host:
        (a, stats_a, sums_a), (b, stats_b, sums_b) = _comparable(host[name]), _comparable(device[name])
        assert a == b, name
        for x, y in zip(stats_a, stats_b):
            assert x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x), (name, x, y)
            judged += bool(x)
        for x, y in zip(sums_a, sums_b):
            assert x.keys() == y.keys() and all(math.isclose(x[k], y[k], rel_tol=SUMMED_TOLERANCE) for k in x), \
                (name, x, y)
            summed += bool(x)
    assert judged >= 15  # the strict statistics of every float output were compared
    assert summed >= 15  # and msprobe's columns, taken on the device


def test_an_accelerator_that_lacks_an_op_hands_its_checks_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that fails on an accelerator (an op it lacks, memory) is noted once, with a warning, the output is
    judged by the host pass, and later outputs there go to the host; on the CPU the failure is raised."""
    rng = np.random.default_rng(2)
    bench = rng.standard_normal(5000).astype(np.float32)
    device = _device_side(rng, bench, "torch.bfloat16", 3)
    rules = _rules(THRESHOLDS, "torch.bfloat16", "elementwise")
    host = strict.strict_compare(bench, device, "torch.bfloat16", rules, row=50)

    def lacking(*args: Any) -> Any:
        raise RuntimeError("no float64 sum here\nmore")

    monkeypatch.setattr(strict_torch, "strict_pass", lacking)
    with pytest.raises(RuntimeError, match="no float64"):  # on the CPU: a bug, not a fallback
        strict.strict_compare(torch.from_numpy(bench), torch.from_numpy(device), "torch.bfloat16", rules, row=50)
    noted: list[Any] = []
    monkeypatch.setattr(strict_torch, "unsupported", lambda where, exc: noted.append((where, str(exc))))
    result = strict.strict_compare(torch.from_numpy(bench), torch.from_numpy(device), "torch.bfloat16", rules, row=50)
    assert same_result(result, host) and noted == [(torch.device("cpu"), "no float64 sum here\nmore")]
    monkeypatch.undo()
    monkeypatch.setattr(strict_torch, "UNSUPPORTED", {})
    monkeypatch.setattr("pytest_msprobe.check.compare.ACCELERATORS", ("meta",))
    meta = [torch.zeros(3, device="meta")]
    assert checks_device(CheckOptions(), meta, None) == torch.device("meta")
    with pytest.warns(RuntimeWarning, match="strict checks on meta failed .no float64 sum here.: they run on the"):
        strict_torch.unsupported(torch.device("meta"), RuntimeError("no float64 sum here\nmore"))
    assert checks_device(CheckOptions(), meta, None) is None


def same_result(a: strict.StrictResult, b: strict.StrictResult) -> bool:
    return (a.status, a.message, a.stats) == (b.status, b.message, b.stats)
