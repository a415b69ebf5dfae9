"""With a spare core the bench (forward and backward) runs in the helper thread beside the device and the third
run: the same records as one thread, errors reported the same way, and never for a call that may draw random
numbers."""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
import torch

from pytest_msprobe.check import calls, check_entry, placement
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
    "Tensor.addcdiv_.0.forward": {"input_args": [tensor("torch.bfloat16", [256, 64]),
                                                 tensor("torch.bfloat16", [256, 64]),
                                                 tensor("torch.bfloat16", [256, 64], mx=2.0, mn=1.0)],
                                  "input_kwargs": {"value": {"type": "float", "value": -0.001}},
                                  "output": [tensor("torch.bfloat16", [256, 64])]},
}
COMPARED = ("status", "message", "outputs", "notes", "reference", "impl")


def _phases_by_thread(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(timing key, thread name) of every timed run from now on."""
    seen: list[tuple[str, str]] = []
    plain = calls.timed

    def spy(timings: dict[str, float], key: str, *args: Any) -> Any:
        seen.append((key, threading.current_thread().name))
        return plain(timings, key, *args)

    monkeypatch.setattr(calls, "timed", spy)
    return seen


def _both(dump: Any, entry: str) -> list[dict[str, Any]]:
    return [check_entry(dump, entry, CheckOptions(device="cpu", standard="strict", work_threads=n), SPECS).to_dict()
            for n in (1, 2)]


@pytest.mark.parametrize("entry", ["Functional.linear.0.forward", "Functional.linear.0.backward",
                                   "Functional.gelu.0.forward"])
def test_the_bench_runs_beside_with_the_same_record(write_dump, monkeypatch, entry) -> None:
    dump = load_dump(write_dump(LINEAR))
    seen = _phases_by_thread(monkeypatch)
    one, two = _both(dump, entry)
    assert one["status"] == "pass" and one["outputs"]
    assert {k: one.get(k) for k in COMPARED} == {k: two.get(k) for k in COMPARED}
    assert "bench_wait_s" not in one["timings"] and two["timings"]["bench_wait_s"] >= 0
    half = len(seen) // 2
    assert all(thread == "MainThread" for _, thread in seen[:half])
    assert {thread for key, thread in seen[half:] if key.startswith("bench")} == {"msprobe-helper_0"}
    assert {thread for key, thread in seen[half:] if key.startswith("device")} == {"MainThread"}
    assert ("bench_backward_s" in dict(seen)) == entry.endswith("backward")


def test_the_benchs_side_is_made_beside_from_the_inputs_as_drawn(write_dump, monkeypatch) -> None:
    """With the bench beside, its side (the casts to fp64) is made in the helper while the device runs: an input
    the call writes is read there as it was drawn, however late, since the device side has a copy of its own.
    Here the helper starts its side only once the device has written its `self`."""
    plain = placement.make_side
    threads: list[str] = []

    def late(*args: Any, **kwargs: Any) -> Any:
        if kwargs["target"].bench:
            threads.append(threading.current_thread().name)
            if threading.current_thread() is not threading.main_thread():
                time.sleep(0.3)  # the device's addcdiv_ is done by now
        return plain(*args, **kwargs)

    monkeypatch.setattr(placement, "make_side", late)
    one, two = _both(load_dump(write_dump(LINEAR)), "Tensor.addcdiv_.0.forward")
    assert one["status"] == "pass" and one["outputs"]
    assert {k: one.get(k) for k in COMPARED} == {k: two.get(k) for k in COMPARED}
    assert threads == ["MainThread", "msprobe-helper_0"]
    assert "inputs_beside_s" not in one["timings"] and two["timings"]["inputs_beside_s"] >= 0.3


@pytest.mark.parametrize("slow", ["device", "bench"])
def test_the_third_run_goes_to_whichever_thread_is_free_first(write_dump, monkeypatch, slow) -> None:
    """The CPU third run waits behind the bench in the helper: the items' thread takes it back when the device is
    done first (a slow bench), the helper runs it when the bench is done first (a slow device); the same record."""
    plain = placement.resolve

    def slowed(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.3)
            return fn(*args, **kwargs)
        return run

    def resolve(*args: Any, **kwargs: Any) -> Any:
        resolved = plain(*args, **kwargs)
        return dataclasses.replace(resolved, **{f"{slow}_fn": slowed(getattr(resolved, f"{slow}_fn"))})

    monkeypatch.setattr(placement, "resolve", resolve)
    seen = _phases_by_thread(monkeypatch)
    one, two = _both(load_dump(write_dump(LINEAR)), "Functional.linear.0.backward")
    assert one["status"] == "pass" and one["reference"].startswith("magnitude")
    assert {k: one.get(k) for k in COMPARED} == {k: two.get(k) for k in COMPARED}
    reference = {thread for key, thread in seen[len(seen) // 2:] if key.startswith("reference")}
    assert reference == {"MainThread" if slow == "bench" else "msprobe-helper_0"}


def test_a_call_that_may_draw_random_numbers_keeps_the_bench_on_its_thread(write_dump, monkeypatch) -> None:
    """dropout's device and torch run draw the same numbers from the one CPU generator: the bench must not
    draw beside them."""
    dump = load_dump(write_dump(LINEAR))
    seen = _phases_by_thread(monkeypatch)
    one, two = _both(dump, "Functional.dropout.0.forward")
    assert {k: one.get(k) for k in COMPARED} == {k: two.get(k) for k in COMPARED}
    assert "bench_wait_s" not in two["timings"] and {thread for _, thread in seen} == {"MainThread"}
    assert placement.may_draw("scaled_dot_product_attention", {"dropout_p": 0.1}, SPECS)
    assert placement.may_draw("rrelu", {}, SPECS) and not placement.may_draw("gelu", {"approximate": "tanh"}, SPECS)


def _with_bench(monkeypatch: pytest.MonkeyPatch, bench_fn: Any) -> None:
    plain = placement.resolve
    monkeypatch.setattr(placement, "resolve", lambda *a, **k: dataclasses.replace(plain(*a, **k), bench_fn=bench_fn))


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
    plain = placement.resolve
    monkeypatch.setattr(placement, "resolve", lambda *a, **k: dataclasses.replace(plain(*a, **k), device_fn=_picky,
                                                                              bench_fn=bench_fn))
    one, two = _both(load_dump(write_dump(LINEAR)), "Functional.gelu.0.forward")
    assert one["status"] == two["status"] == ("SKIP" if bench_fn is _picky else "error")
    assert one["message"] == two["message"] and "not positive-definite" in one["message"]
    assert ("break a precondition" in one["message"]) == (bench_fn is _picky)


def test_an_item_stopped_by_its_timeout_does_not_wait_for_the_bench(write_dump, monkeypatch) -> None:
    """msprobe_timeout's SIGALRM raises a BaseException in the items' thread: the item ends then, not when the
    bench beside it is done (its record is made elsewhere; the helper finishes the bench on its own)."""
    import signal

    from pytest_msprobe.helper import helper

    class Stopped(BaseException):
        pass

    def slow_bench(*args: Any, **kwargs: Any) -> Any:
        time.sleep(3.0)
        return torch.nn.functional.gelu(*args, **kwargs)

    _with_bench(monkeypatch, slow_bench)

    def stop(signum: int, frame: Any) -> None:
        raise Stopped

    previous = signal.signal(signal.SIGALRM, stop)
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Stopped):
            check_entry(load_dump(write_dump(LINEAR)), "Functional.gelu.0.forward",
                        CheckOptions(device="cpu", standard="strict", work_threads=2), SPECS)
        stopped = time.monotonic() - started
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        helper().submit(lambda: None).result()  # the bench, finished in the helper
    assert stopped < 2.0



def test_the_helper_thread_can_be_turned_off(pytester: pytest.Pytester, monkeypatch) -> None:
    """msprobe_helper_thread=off keeps every item's work in its own thread (for device plugins that change torch
    for every thread): no bench beside, the same records; a bad ini value is a usage error naming the choices."""
    from pytest_msprobe.session import devices
    from tests.helpers import EXAMPLES, api_records, copy_dump

    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # a spare core
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    dump = copy_dump(pytester, EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0", "d")
    runs = {}
    for setting in ("auto", "off"):
        result = pytester.runpytest_inprocess(str(dump), "--msprobe-device", "cpu", "-p", "no:randomly",
                                              "-o", f"msprobe_helper_thread={setting}", "--msprobe-out", setting)
        assert result.ret == 0
        runs[setting] = api_records(pytester, setting)
    assert any("bench_wait_s" in r["timings"] for r in runs["auto"].values())
    assert not any("bench_wait_s" in r["timings"] for r in runs["off"].values())
    assert {k: {f: r.get(f) for f in COMPARED} for k, r in runs["auto"].items()} == \
        {k: {f: r.get(f) for f in COMPARED} for k, r in runs["off"].items()}
    pytester.makeini("[pytest]\nmsprobe_helper_thread = sometimes\n")
    bad = pytester.runpytest_inprocess(str(dump), "--msprobe-device", "cpu")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "msprobe_helper_thread: 'sometimes' is not one of auto, off" in bad.stderr.str()
