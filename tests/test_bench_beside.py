"""With a spare core the bench (forward and backward) runs in the helper thread beside the device and the third
run: the same records as one thread, errors reported the same way, and never for a call that may draw random
numbers."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch

from pytest_msprobe.check import check_entry, rerun
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.settings import CheckOptions
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import tensor

SPECS = load_specs()
LINEAR = {
    "Functional.linear.0.forward": {
        "input_args": [tensor("torch.bfloat16", [64, 1024], requires_grad=True),
                       tensor("torch.bfloat16", [96, 1024], requires_grad=True)],
        "input_kwargs": {}, "output": [tensor("torch.bfloat16", [64, 96])]},
    "Functional.linear.0.backward": {"input": [tensor("torch.bfloat16", [64, 96])], "output": []},
    "Functional.gelu.0.forward": {"input_args": [tensor("torch.float16", [128, 64], mx=4.0, mn=-4.0)],
                                  "input_kwargs": {}, "output": [tensor("torch.float16", [128, 64])]},
    "Functional.dropout.0.forward": {"input_args": [tensor("torch.float32", [256, 64])],
                                     "input_kwargs": {"p": {"type": "float", "value": 0.25},
                                                      "training": {"type": "bool", "value": True}},
                                     "output": [tensor("torch.float32", [256, 64])]},
}
COMPARED = ("status", "message", "outputs", "notes", "reference", "impl")


def _phases_by_thread(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(timing key, thread name) of every timed run from now on."""
    seen: list[tuple[str, str]] = []
    plain = rerun._timed

    def spy(timings: dict[str, float], key: str, *args: Any) -> Any:
        seen.append((key, threading.current_thread().name))
        return plain(timings, key, *args)

    monkeypatch.setattr(rerun, "_timed", spy)
    return seen


def _both(dump: Any, entry: str) -> list[dict[str, Any]]:
    return [check_entry(dump, entry, CheckOptions(device="cpu", standard="strict", work_threads=n), SPECS)
            for n in (1, 2)]


@pytest.mark.parametrize("entry", ["Functional.linear.0.forward", "Functional.linear.0.backward",
                                   "Functional.gelu.0.forward"])
def test_the_bench_runs_beside_with_the_same_record(write_dump, monkeypatch, entry) -> None:
    dump = load_dump(write_dump(LINEAR))
    seen = _phases_by_thread(monkeypatch)
    one, two = _both(dump, entry)
    assert one["status"] == "pass" and one["outputs"]
    assert {k: one.get(k) for k in COMPARED} == {k: two.get(k) for k in COMPARED}
    assert "bench_beside" not in one and two["bench_beside"] is True
    half = len(seen) // 2
    bench_keys = {"bench_s", "bench_backward_s"}
    assert all(thread == "MainThread" for _, thread in seen[:half])
    assert {thread for key, thread in seen[half:] if key in bench_keys} == {"msprobe-helper_0"}
    assert {thread for key, thread in seen[half:] if key not in bench_keys} == {"MainThread"}
    assert ("bench_backward_s" in dict(seen)) == entry.endswith("backward")


def test_a_call_that_may_draw_random_numbers_keeps_the_bench_on_its_thread(write_dump, monkeypatch) -> None:
    """dropout's device and torch run draw the same numbers from the one CPU generator: the bench must not
    draw beside them."""
    dump = load_dump(write_dump(LINEAR))
    seen = _phases_by_thread(monkeypatch)
    one, two = _both(dump, "Functional.dropout.0.forward")
    assert {k: one.get(k) for k in COMPARED} == {k: two.get(k) for k in COMPARED}
    assert "bench_beside" not in two and {thread for _, thread in seen} == {"MainThread"}
    assert rerun.may_draw("scaled_dot_product_attention", {"dropout_p": 0.1}, SPECS)
    assert rerun.may_draw("rrelu", {}, SPECS) and not rerun.may_draw("gelu", {"approximate": "tanh"}, SPECS)


def _with_bench(monkeypatch: pytest.MonkeyPatch, bench_fn: Any) -> None:
    plain = rerun.resolve
    monkeypatch.setattr(rerun, "resolve", lambda *a, **k: dataclasses.replace(plain(*a, **k), bench_fn=bench_fn))


def test_a_bench_that_raises_beside_is_reported_as_on_one_thread(write_dump, monkeypatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bench kernel missing")

    _with_bench(monkeypatch, broken)
    dump = load_dump(write_dump(LINEAR))
    for entry in ("Functional.gelu.0.forward", "Functional.linear.0.backward"):
        one, two = _both(dump, entry)
        assert one["status"] == two["status"] == "error"
        assert one["message"] == two["message"] == "bench run raised RuntimeError: bench kernel missing"


def _picky(x: torch.Tensor) -> torch.Tensor:
    """Raises on real values (as Cholesky of a matrix that is not positive-definite), not on meta tensors."""
    if x.device.type == "meta":
        return x
    raise ValueError(f"matrix of {x.numel()} elements is not positive-definite")


@pytest.mark.parametrize("bench_fn", [_picky, torch.nn.functional.gelu])
def test_a_precondition_both_sides_break_is_a_skip_beside_too(write_dump, monkeypatch, bench_fn) -> None:
    """The device's failure on random inputs is a skip when the bench, run beside it, failed the same way, and
    stays a failure when the bench went through."""
    plain = rerun.resolve
    monkeypatch.setattr(rerun, "resolve", lambda *a, **k: dataclasses.replace(plain(*a, **k), device_fn=_picky,
                                                                              bench_fn=bench_fn))
    one, two = _both(load_dump(write_dump(LINEAR)), "Functional.gelu.0.forward")
    assert one["status"] == two["status"] == ("SKIP" if bench_fn is _picky else "error")
    assert one["message"] == two["message"] and "not positive-definite" in one["message"]
    assert ("break a precondition" in one["message"]) == (bench_fn is _picky)
