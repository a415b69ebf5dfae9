"""The memory estimate against measured peaks, on each kind of call that is cut into pieces.

What the budget bounds is the live memory of the runs beside the device output. So the inner run measures with
the allocator returning every freed block (glibc's environment knobs, and the check's own policy of keeping freed
blocks turned off): resident memory is then live memory, and equal runs measure the same. The peak of the pieces'
stage (the bench, third and magnitude runs a block of rows at a time, and both passes), counted from its start,
must stay within the budget.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import make_dump, records, tensor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/self/clear_refs").exists(),
                                reason="measures with /proc/self/clear_refs and VmHWM (Linux)")

MEASURE = """
import json, os
import pytest
import pytest_msprobe.runs.memory as memory
from pytest_msprobe.check import rerun

memory.keep_freed_memory = lambda: None  # freed blocks go back to the system: resident is live
PEAKS, CURRENT = {}, {}

def _status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def _measured(name, fn):
    def wrapped(*args, **kwargs):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here
        before = _status("VmRSS")
        try:
            return fn(*args, **kwargs)
        finally:
            CURRENT[name] = _status("VmHWM") - before
    return wrapped

rerun.Pieces.compare = _measured("pieces", rerun.Pieces.compare)

@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    CURRENT.clear()
    try:
        return (yield)
    finally:
        PEAKS[item.name] = dict(CURRENT)

def pytest_unconfigure(config):
    with open("peaks.json", "w") as f:
        json.dump(PEAKS, f)
"""
BF16 = "torch.bfloat16"
ROWS, WIDTH = 2048, 4096  # 16 MiB outputs in bf16


def _dump(pytester: pytest.Pytester) -> Path:
    """One call of each kind, each twice: the first may compile the passes for its kind (a fresh checkout has no
    numba cache), the second is measured."""
    return make_dump(pytester, {name.replace(".0.", f".{k}."): entry for k in (0, 1) for name, entry in _calls().items()})


def _calls() -> dict[str, dict]:
    big = [ROWS, WIDTH]
    return {
        "Functional.linear.0.forward": {"input_args": [tensor(BF16, [1, ROWS, 1024]), tensor(BF16, [WIDTH, 1024],
                                                                                            0.1, -0.1)],
                                        "input_kwargs": {}, "output": [tensor(BF16, [1, ROWS, WIDTH])]},
        "Functional.softmax.0.forward": {"input_args": [tensor(BF16, big, 8.0, -8.0), {"type": "int", "value": -1}],
                                         "input_kwargs": {}, "output": [tensor(BF16, big)]},
        "Functional.silu.0.forward": {"input_args": [tensor(BF16, big, 6.0, -6.0)], "input_kwargs": {},
                                      "output": [tensor(BF16, big)]},
        "Functional.rms_norm.0.forward": {"input_args": [tensor(BF16, big), [{"type": "int", "value": WIDTH}],
                                                         tensor(BF16, [WIDTH])],
                                          "input_kwargs": {}, "output": [tensor(BF16, big)]},
        "Tensor.add_.0.forward": {"input_args": [tensor(BF16, big), tensor(BF16, big)],
                                  "input_kwargs": {"alpha": {"type": "float", "value": 0.01}},
                                  "output": [tensor(BF16, big)]},
        # a backward item: its input's and weight's gradients
        "Torch.matmul.0.forward": {"input_args": [tensor(BF16, [1, ROWS, 1024], requires_grad=True),
                                                  tensor(BF16, [1024, WIDTH], 0.1, -0.1, requires_grad=True)],
                                   "input_kwargs": {}, "output": [tensor(BF16, [1, ROWS, WIDTH])]},
        "Torch.matmul.0.backward": {"input": [tensor(BF16, [1, ROWS, WIDTH])],
                                    "output": [tensor(BF16, [1, ROWS, 1024]), tensor(BF16, [1024, WIDTH])]},
        # and a row-local one
        "Functional.gelu.0.forward": {"input_args": [tensor(BF16, big, 6.0, -6.0, requires_grad=True)],
                                      "input_kwargs": {}, "output": [tensor(BF16, big)]},
        "Functional.gelu.0.backward": {"input": [tensor(BF16, big)], "output": [tensor(BF16, big)]},
    }


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
         budget: str) -> tuple[dict[str, dict[str, int]], dict[str, dict]]:
    pytester.makeconftest(MEASURE)
    dump = _dump(pytester)
    for knob in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.setenv(knob, "131072")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-standard", "strict", "--msprobe-max-memory",
                                           budget, "-p", "no:randomly", "-p", "no:cacheprovider")
    assert result.ret == 0, str(result.stdout)[-2000:]
    peaks = json.loads((pytester.path / "peaks.json").read_text())
    return peaks, {f"{r['api']}.{r['direction']}": r for r in records(pytester)}


@pytest.mark.parametrize("mib", [32, 64])
def test_the_runs_in_pieces_stay_within_the_budget(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                   mib: int) -> None:
    peaks, recs = _run(pytester, monkeypatch, f"{mib}MiB")
    assert len(peaks) == 2 * len(_calls())
    peaks = {name: peak for name, peak in peaks.items() if ".1." in name}  # the second of each kind
    measured = {name: (peak["pieces"] / 2**20, recs[name]["pieces"]) for name, peak in peaks.items()}
    for name, peak in peaks.items():
        assert recs[name]["pieces"], name  # every kind was cut
        assert 0 < peak["pieces"] <= mib << 20, measured
