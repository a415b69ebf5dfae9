"""Evidence pooled over an API's calls: an optimizer's in-place update on many small tensors that rounds toward
zero fails as one pooled item on the controller (each call alone passes), correct kernels stay green, and the
rule is the same under xdist and in the unit that judges a pool."""
from __future__ import annotations

from typing import Any

import pytest

from pytest_msprobe.records.record import Record, Row
from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import pooled
from tests.helpers import api_records, device_side_conftest, make_dump, tensor

F32 = "torch.float32"

# add_ rounding toward zero: the exact result in float64, then the float32 neighbour nearer zero where it rounded up
TRUNCATED_ADD = device_side_conftest("""
import torch
def add_(orig, x, other, *a, alpha=1, **k):
    exact = x.double() + alpha * other.double()
    near = exact.to(x.dtype)
    toward = torch.where(near.double().abs() > exact.abs(), torch.nextafter(near, torch.zeros_like(near)), near)
    return x.copy_(toward)
IMPLS = {torch.Tensor.add_: add_}
""")


def _updates(calls: int, size: int) -> dict[str, Any]:
    """An optimizer's `p.add_(update, alpha=-lr)` on `calls` parameters of `size` elements each."""
    return {f"Tensor.add_.{i}.forward": {
        "input_args": [tensor(F32, [size], mx=0.5, mn=-0.5), tensor(F32, [size], mx=1e-2, mn=-1e-2)],
        "input_kwargs": {"alpha": {"type": "float", "value": -0.001}}, "output": [tensor(F32, [size])]}
        for i in range(calls)}


@pytest.mark.parametrize("workers", [0, 2])
def test_small_updates_that_round_toward_zero_fail_as_one_pooled_item(pytester: pytest.Pytester,
                                                                       workers: int) -> None:
    pytester.makeconftest(TRUNCATED_ADD)
    dump = make_dump(pytester, _updates(24, 4))
    args = [str(dump), "-p", "no:cacheprovider", "-rf"] + (["-n", str(workers)] if workers else [])
    result = pytester.runpytest(*args)
    records = api_records(pytester)
    calls = {k: r for k, r in records.items() if "[pooled" not in k}
    assert len(calls) == 24 and all(r["status"] == "pass" for r in calls.values())  # too small alone
    result.assert_outcomes(passed=24, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*calls too small for their own bias test are biased towards zero*",
                                 "FAILED d/dump.json::Tensor.add_.forward[[]pooled float32 output 0[]]*"])
    pool = records["Tensor.add_[pooled float32 output 0].forward"]
    assert pool["status"] == "error" and "Tensor.add_.0" in pool["message"] and "Tensor.add_.23" in pool["notes"][0]


def test_correct_small_updates_pass_pooled_too(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, _updates(12, 4))
    result = pytester.runpytest(str(dump), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    assert result.ret == 0


def _record(i: int, wrong: tuple[int, int, int], small: tuple[float, float] | None = None,
            verdict: str = "pass") -> Record:
    stats = {"wrong": float(wrong[0]), "wrong_zero": float(wrong[1]), "wrong_up": float(wrong[2])}
    if small is not None:
        stats.update(small_bias_zero=small[0], small_ref_bias_zero=small[1], small_bias_min_ulp=0.02)
    row = Row(f"Tensor.mul_.{i}.forward.output.0", verdict, "", "torch.float64", "torch.bfloat16", [4], {},
              verdict=verdict, reference=stats)
    return Record(f"Tensor.mul_.{i}", "forward", 0, status=verdict, outputs=[row], standard="strict",
                  dump="d/dump.json")


def test_the_pooled_sign_test_counts_the_lean_of_every_call() -> None:
    specs = load_specs()
    leaning = [_record(i, (4, 4, 0)) for i in range(20)]  # 80 of 80 toward zero: z = 8.9 > 6
    assert [v.pool.calls for v in pooled.failed(leaning, specs)] == [[f"Tensor.mul_.{i}" for i in range(20)]]
    either = [_record(i, (4, 2 + i % 2, 2 - i % 2)) for i in range(20)]  # ties resolved either way
    assert pooled.failed(either, specs) == []
    few = [_record(i, (4, 4, 0)) for i in range(8)]  # 32 of 32: z = 5.7, not enough
    assert pooled.failed(few, specs) == []
    failing = [_record(i, (4, 4, 0), verdict="error") for i in range(20)]  # each failed already: nothing pooled
    assert pooled.failed(failing, specs) == []
    decompositions = [_record(i, (4, 4, 0)) for i in range(20)]
    for record in decompositions:
        record.outputs[0].check = "decomposition"  # passed by the factors' validity, whatever its elements say
    assert pooled.failed(decompositions, specs) == []
    repeated = [_record(i, (4, 4, 0)) for i in range(20)]
    for record in repeated[8:]:
        record.reused_from = "Tensor.mul_.0"  # the same call again (msprobe_filter_api): its first one's record
    assert pooled.failed(repeated, specs) == []


def test_the_pooled_bias_test_holds_small_calls_against_the_torch_run() -> None:
    specs = load_specs()
    biased = [_record(i, (0, 0, 0), small=(0.4 + 0.01 * (i % 3), 0.0)) for i in range(10)]
    assert len(pooled.failed(biased, specs)) == 1
    as_torch = [_record(i, (0, 0, 0), small=(0.4 + 0.01 * (i % 3), 0.4)) for i in range(10)]  # torch's kernel too
    assert pooled.failed(as_torch, specs) == []
    noisy = [_record(i, (0, 0, 0), small=((-1) ** i * 0.3, 0.0)) for i in range(10)]
    assert pooled.failed(noisy, specs) == []


def test_an_in_process_block_pools_its_calls_by_the_runs_standard() -> None:
    from pytest_msprobe.inprocess.outputs import pooled_records
    from pytest_msprobe.settings import CheckOptions, Settings

    calls = [_record(i, (4, 4, 0)) for i in range(20)]
    for record in calls:
        record.standard = None  # an in-process block's records do not name it
    found = pooled_records(calls, Settings(check_options=CheckOptions(), standard="strict"))
    assert [r.api for r in found] == ["Tensor.mul_[pooled bfloat16 output 0]"] and found[0].status == "error"
    assert pooled_records(calls, Settings(check_options=CheckOptions(), standard="msprobe")) == []
