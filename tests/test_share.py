"""helper.share and helper.wait_helping: a pass cut into grains that both threads take, with the result of one
pass in order whoever took which grain, and a failure reported by the pass's owner."""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from pytest_msprobe.helper import helper, share, wait_helping
from pytest_msprobe.metrics import fused


def _grains(count: int, grain: int, *, on_helper: bool, join: bool = False,
            fail_at: int | None = None) -> tuple[list[tuple[int, int, str]], Any]:
    """Run share() over `count` with a slow work function, in the helper thread (the items' thread waiting with
    wait_helping) or in this one; the grains taken, by whom, and the owner's result (or its exception)."""
    taken: list[tuple[int, int, str]] = []
    joined = threading.Event()  # the thread that did not start the pass has taken a grain

    def work(start: int, stop: int) -> None:
        name = threading.current_thread().name
        taken.append((start, stop, name))
        if name.startswith("msprobe-helper") != on_helper:
            joined.set()
        elif fail_at is None:
            joined.wait(5)  # a busy machine (or a helper still busy) must not decide who takes a grain
        time.sleep(0.002)
        if fail_at is not None and start <= fail_at < stop:
            raise ValueError(f"grain at {start}")

    def owner() -> str:
        share(count, grain, work, join=join)
        return "done"

    if on_helper:
        future = helper().submit(owner)
        try:
            return taken, wait_helping(future)
        except ValueError as error:
            return taken, error
    try:
        return taken, owner()
    except ValueError as error:
        return taken, error


def test_the_waiting_thread_takes_grains_of_the_helpers_pass() -> None:
    taken, result = _grains(400, 10, on_helper=True)
    assert result == "done"
    assert sorted((a, b) for a, b, _ in taken) == [(s, s + 10) for s in range(0, 400, 10)]  # each grain once
    assert {who.startswith("msprobe-helper") for _, _, who in taken} == {True, False}  # both threads took some


def test_the_helper_joins_a_pass_of_this_thread_only_when_asked() -> None:
    taken, result = _grains(400, 10, on_helper=False, join=True)
    assert result == "done" and len(taken) == 40
    assert any(who.startswith("msprobe-helper") for _, _, who in taken)
    taken, _ = _grains(400, 10, on_helper=False, fail_at=-1)
    assert taken == [(0, 400, threading.current_thread().name)]  # one call: nobody may join


def test_a_failing_grain_is_raised_by_the_owner_whichever_thread_ran_it() -> None:
    for on_helper in (True, False):
        taken, result = _grains(400, 10, on_helper=on_helper, join=True, fail_at=205)
        assert isinstance(result, ValueError) and str(result) == "grain at 200"
        assert len(taken) < 40  # the pass stopped: no thread took further grains


def test_a_pass_smaller_than_a_grain_is_one_call() -> None:
    taken, result = _grains(10, 10, on_helper=True, fail_at=-1)  # (no waiting for the other thread)
    assert result == "done" and taken == [(0, 10, taken[0][2])] and taken[0][2].startswith("msprobe-helper")


@pytest.mark.parametrize("ulp", [None, (7, -126, 1.0)])
@pytest.mark.parametrize("special", [True, False])
def test_msprobes_metric_pass_in_grains_of_both_threads_is_bitwise_one_pass(ulp: Any, special: bool) -> None:
    """A 1M-element bf16 output beside an fp32 bench (NaN, inf and subnormals in it, or none): the statistics from
    grains taken by the helper and the waiting thread equal those of one call in this thread, bit for bit. The
    largest error appears twice, in different grains: the first is the worst element."""
    rng = np.random.default_rng(4)
    n = 1 << 20
    bench = (rng.standard_normal(n) * np.exp(rng.uniform(-10, 10, n))).astype(np.float32)
    bench[[200_000, 800_000]] = 1e30
    if special:
        bench[[5, 70_000, 900_000]] = [np.nan, np.inf, 1e-40]
    x = bench.view(np.uint32).astype(np.int64)
    device = ((x + (((x >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    device[rng.random(n) < 0.3] += 1
    device[[200_000, 800_000]] = 0  # the same, largest, error twice
    if special:
        device[[600_000, 600_001]] = [0x7FC0, 0xFF80]  # a NaN and -inf where the bench is finite
    limits = fused.Limits(eps=1e-10, small_value=1e-3, atol=1e-5, rtol=5e-3, dual=(0.01, 0.001, 0.0001), ulp=ulp)
    alone = fused.compute(bench, device, np.dtype(np.float32), limits)
    shared = wait_helping(helper().submit(fused.compute, bench, device, np.dtype(np.float32), limits))
    assert repr(shared) == repr(alone)  # every field, NaN included
    assert alone.worst == (5 if special else 200_000)  # numpy's argmax: the first NaN, else the first largest
