"""helper.share and helper.wait_helping: a pass cut into grains that both threads take, with the result of one
pass in order whoever took which grain, and a failure reported by the pass's owner."""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from pytest_msprobe.helper import helper, share, wait_helping
from pytest_msprobe.metrics import fused, stats


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
    limits = stats.Limits(eps=1e-10, small_value=1e-3, atol=1e-5, rtol=5e-3, dual=(0.01, 0.001, 0.0001), ulp=ulp)
    alone = fused.compute(bench, device, np.dtype(np.float32), limits)
    shared = wait_helping(helper().submit(fused.compute, bench, device, np.dtype(np.float32), limits))
    assert repr(shared) == repr(alone)  # every field, NaN included
    assert alone.worst == (5 if special else 200_000)  # numpy's argmax: the first NaN, else the first largest


@pytest.mark.parametrize("dtype, kind, third", [("torch.bfloat16", "exact", "t"), ("torch.bfloat16", "reduction", "t"),
                                                ("torch.float16", "contraction", "mag"),
                                                ("torch.float32", "elementwise", None)])
def test_the_strict_pass_in_grains_of_both_threads_is_bitwise_one_pass(dtype: str, kind: str, third: str | None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1M-element output in some 30 blocks: the totals from blocks that both threads took (the pass run by the
    helper thread, whose blocks the thread waiting for it takes too) equal those of one call, bit for bit: sums,
    the worst position (the largest error twice, in different grains), a NaN and an inf late in the output, the
    first wrongly rounded element, and the bias test's group sums."""
    from pytest_msprobe.specs.loader import load_specs
    from pytest_msprobe.verdict.judge import element_rules as _rules
    from pytest_msprobe.verdict.strict import numba_kernel, numba_pass, rules

    from .test_strict_kernel import _device_side, _totals, stored

    rng = np.random.default_rng(5)
    n = 1 << 20
    wide = np.float64 if dtype == "torch.float32" else np.float32
    bench = (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(wide)
    device = _device_side(rng, bench, dtype, 1)
    worst = bench[300_000] * 2
    device[[300_000, 900_000]] = device.dtype.type(worst)  # the same largest error twice, grains apart
    bench[900_000] = bench[300_000]
    with np.errstate(all="ignore"):
        device[[700_000, 700_001]] = [np.nan, np.inf]  # where the bench is finite: a block with a NaN has no maximum
    flat = {"b": bench, "d": stored(device) if dtype == "torch.bfloat16" else device}
    if third == "t":
        torch_run = _device_side(rng, bench, dtype, 0)
        flat["t"] = stored(torch_run) if dtype == "torch.bfloat16" else torch_run
    elif third == "mag":
        flat["mag"] = (np.abs(bench) * 3).astype(np.float32)
    limits = _rules(load_specs()["thresholds"]["strict"], dtype, kind)
    with np.errstate(all="ignore"):
        alone = _totals(numba_pass.judge_blocks(flat, 1000, dtype, limits, kind))
    assert alone["worst"][0] in (300_000, 700_000, 900_000)  # (a row's scale may weigh the two apart)

    other = threading.Event()  # the waiting thread has taken blocks
    takers: list[str] = []
    blocks = numba_kernel.strict_blocks

    def spy(*args: Any) -> None:
        mine = threading.current_thread().name.startswith("msprobe-helper")
        takers.append("helper" if mine else "waiting")
        if mine:
            other.wait(5)  # a busy machine must not decide who takes a grain
        else:
            other.set()
        blocks(*args)

    monkeypatch.setattr(numba_kernel, "strict_blocks", spy)
    with np.errstate(all="ignore"):
        shared = wait_helping(helper().submit(numba_pass.judge_blocks, flat, 1000, dtype, limits, kind))
    block = rules.plan(flat, 1000, limits, kind)[1]
    assert {"helper", "waiting"} <= set(takers) and len(takers) == -(-n // (block * (numba_pass.GRAIN // block)))
    assert _totals(shared) == alone
