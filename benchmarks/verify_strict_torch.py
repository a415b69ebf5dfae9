"""The strict checks in torch ops (verdict/strict/torch_pass.py) against the compiled host pass on every output of
a real run, and the cost per element of each.

    python -m pytest -p benchmarks.verify_strict_torch DUMP_JSON --msprobe-device cpu -n 0 [...]
    VERIFY_TORCH_DEVICE=cuda python -m pytest -p benchmarks.verify_strict_torch DUMP_JSON --msprobe-device cuda -n 0

A pytest plugin: every strict check of the run (judge.strict_verdict) is made both ways, on the same arrays:
by the compiled host pass on numpy arrays, and by the torch pass on tensors on VERIFY_TORCH_DEVICE (default
cpu; where the run's own checks already ran in torch ops, on the tensors they used). It requires the same
status and message and every statistic within 1e-9 relative, and times each: the host pass in CPU time of
the calling thread, the torch pass in wall time with the device synchronised (CPU time on a CPU), and apart
the copy of the bench (and any array not yet there) to the device. At the end it prints the outputs and
elements compared, the mismatches, and the cost per element, and writes them as JSON to
$VERIFY_STRICT_OUT if set. Run it with -n 0 (the patch lives in the process that runs the items).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_model
from pytest_msprobe.verdict import judge, strict
from pytest_msprobe.verdict.strict import backends

TOLERANCE = 1e-9
_totals: dict[str, Any] = {"outputs": 0, "elements": 0, "mismatches": [], "host_s": 0.0, "torch_s": 0.0,
                           "copy_s": 0.0, "first_s": None}
_FIELDS = ("bench", "device", "torch_run", "magnitude", "product", "estimated")


def results_agree(a: strict.StrictResult, b: strict.StrictResult) -> bool:
    if a.status != b.status or a.message != b.message or a.stats.keys() != b.stats.keys():
        return False
    for key, x in a.stats.items():
        y = b.stats[key]
        if key.endswith("_t") and min(abs(x), abs(y)) > 1e6:
            continue  # the ratio of two roundings of equal group means: past any limit either way
        if not (x == y or (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=TOLERANCE)):
            return False
    return True


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)  # type: ignore[attr-defined]


def _clock(device: Any) -> float:
    return time.thread_time() if device.type == "cpu" else time.perf_counter()


def pytest_configure(config: Any) -> None:
    install()


def install() -> None:
    """judge.strict_verdict checks both ways, compares and times them from now on."""
    import numpy as np
    import torch

    verdict = judge.strict_verdict
    target = torch.device(os.environ.get("VERIFY_TORCH_DEVICE", "cpu"))

    def both(arrays: judge.StrictArrays, device_dtype: str, th: Any) -> strict.StrictResult:
        on_device = isinstance(arrays.device, torch.Tensor)
        where = arrays.device.device if on_device else target
        on_host: dict[str, Any] = {k: backends.host(getattr(arrays, k)) for k in _FIELDS
                                   if getattr(arrays, k) is not None}
        host = dataclasses.replace(arrays, **on_host)
        t0 = _clock(where)
        placed: dict[str, Any] = {} if on_device else {
            k: torch.from_numpy(np.ascontiguousarray(getattr(arrays, k))).to(where) for k in _FIELDS
            if getattr(arrays, k) is not None}
        tensors = arrays if on_device else dataclasses.replace(arrays, **placed)
        synchronize(where)
        t1 = _clock(where)
        fast = verdict(tensors, device_dtype, th)
        synchronize(where)
        t2, t3 = _clock(where), time.thread_time()
        slow = verdict(host, device_dtype, th)
        t4 = time.thread_time()
        if _totals["first_s"] is None:
            _totals["first_s"] = t2 - t1 + t4 - t3  # includes loading numba's compiled pass
        else:
            _totals["copy_s"] += t1 - t0
            _totals["torch_s"] += t2 - t1
            _totals["host_s"] += t4 - t3
            _totals["elements"] += int(strict.size_of(host.device))
        _totals["outputs"] += 1
        if not results_agree(fast, slow):
            _totals["mismatches"].append({"dtype": device_dtype, "kind": arrays.kind, "n": int(host.device.size),
                                          "torch": [fast.status, fast.message], "host": [slow.status, slow.message]})
        _totals["device"] = str(where)
        return fast if on_device else slow

    judge.strict_verdict = both


def pytest_unconfigure(config: Any) -> None:
    if not hasattr(config, "workerinput"):
        report()


def report() -> None:
    """Print (and write to $VERIFY_STRICT_OUT) what was compared."""
    if not _totals["outputs"]:
        return
    n = max(_totals["elements"], 1)
    summary = {**_totals, "host_ns_per_element": _totals["host_s"] / n * 1e9,
               "torch_ns_per_element": _totals["torch_s"] / n * 1e9, "copy_ns_per_element": _totals["copy_s"] / n * 1e9,
               "cpu": cpu_model()}
    print(f"\nstrict checks on {summary['outputs']} outputs ({summary['elements']:,} elements after the first): "
          f"{len(summary['mismatches'])} mismatches; torch ops on {summary.get('device')} "
          f"{summary['torch_ns_per_element']:.2f} ns/element (+ copies {summary['copy_ns_per_element']:.2f}), "
          f"compiled host pass {summary['host_ns_per_element']:.2f} ns/element; {summary['cpu']}")
    out = os.environ.get("VERIFY_STRICT_OUT")
    if out:
        Path(out).write_text(json.dumps(summary, indent=1))
