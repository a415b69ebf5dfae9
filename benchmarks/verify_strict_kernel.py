"""The compiled checks against their numpy oracles on every output of a real run, and their cost.

    python -m pytest -p benchmarks.verify_strict_kernel DUMP_JSON --msprobe-device cpu -n 0 [...]
    python -m benchmarks verify_strict_kernel PLANTED_BUGS_ARGS...   (python -m evals planted_bugs, verified)

A pytest plugin: every call of the strict pass (verdict/strict/backends.judge_blocks) runs both the compiled kernel
(verdict/strict/numba_kernel.py) and the numpy oracle (tests/strict_oracle.py) on the same arrays, requires every
total to be bitwise equal (so every record's verdict, message and statistics are the same), and times each
in CPU time of the calling thread (the load of a shared machine does not count). Likewise every row of
msprobe's metrics (standards.compare_tensor) is computed by the compiled pass (metrics/numba_kernel.py) and by
numpy (metrics/vectorised.py): status, message, worst element and every column must be equal, bitwise but
for stats.py's two tolerances (cosine 1e-12, mean relative error 1e-5 relative). At the end it prints the
outputs and elements compared, the mismatches, and the cost per element of each, and writes them as JSON to
$VERIFY_STRICT_OUT if set. Run it with -n 0 (the patch lives in the process that runs the items).
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.machine import cpu_model
from pytest_msprobe.metrics import fused
from pytest_msprobe.verdict import standards
from pytest_msprobe.verdict.strict import backends

_totals: dict[str, Any] = {"outputs": 0, "elements": 0, "mismatches": [], "kernel_s": 0.0, "numpy_s": 0.0,
                           "first_s": None}
_metrics: dict[str, Any] = {"rows": 0, "elements": 0, "mismatches": [], "kernel_s": 0.0, "numpy_s": 0.0,
                            "first_s": None}
_numpy_here = threading.local()  # set while a thread computes the numpy row


def _key(acc: Any) -> list[Any]:
    """Every total of a strict.rules.Totals, NaN-safe and sign-of-zero-safe, for a bitwise comparison (NaNs compare
    equal whatever their sign bit, which numpy's and the kernel's sums of NaNs set differently)."""
    def bits(x: float) -> Any:
        return "nan" if math.isnan(x) else float(x).hex()

    scalars = [bits(acc.sum_w), bits(acc.sum_t), bits(acc.max_t), bits(acc.max_w), acc.worst, acc.gross, acc.wrong,
               acc.first_wrong, acc.wrong_zero, acc.wrong_up, acc.wrong_off_tie]
    def canonical(a: np.ndarray) -> np.ndarray:  # a NaN's sign bit means nothing (an all-NaN output's groups)
        return np.where(np.isnan(a), np.nan, a)

    arrays = [canonical(np.concatenate(acc.bias[k])).tobytes().hex() if acc.bias[k] else "" for k in sorted(acc.bias)]
    counts = np.concatenate(acc.counts).astype(np.int64).tobytes().hex() if acc.counts else ""
    return [*scalars, *arrays, counts]


def pytest_configure(config: Any) -> None:
    install()


def install() -> None:
    """backends.judge_blocks runs both passes, compares them and times them from now on."""
    from tests.strict_oracle import judge_blocks as oracle

    kernel = backends.judge_blocks

    def both(flat: dict[str, np.ndarray], row: int, device_dtype: str, rules: Any, kind: str) -> Any:
        t0 = time.thread_time()
        fast = kernel(flat, row, device_dtype, rules, kind)
        t1 = time.thread_time()
        slow = oracle(flat, row, device_dtype, rules, kind)
        t2 = time.thread_time()
        if _totals["first_s"] is None:
            _totals["first_s"] = t1 - t0  # includes importing numba and loading (or compiling) the kernel
        else:
            _totals["kernel_s"] += t1 - t0
            _totals["numpy_s"] += t2 - t1
            _totals["elements"] += int(flat["d"].size)
        _totals["outputs"] += 1
        if _key(fast) != _key(slow):
            _totals["mismatches"].append({"dtype": device_dtype, "kind": kind, "n": int(flat["d"].size)})
        return fast

    backends.judge_blocks = both
    _install_metrics()


def _install_metrics() -> None:
    """standards.compare_tensor computes each row twice, compiled and in numpy, and compares them."""
    supported, compare = fused.supported, standards.compare_tensor

    def only_compiled(*args: Any, **kwargs: Any) -> bool:
        return not getattr(_numpy_here, "on", False) and supported(*args, **kwargs)

    def rows(name: str, bench: Any, device: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        fast = compare(name, bench, device, **kwargs)
        t1 = time.thread_time()
        _numpy_here.on = True
        try:
            slow = compare(name, bench, device, **kwargs)
        finally:
            _numpy_here.on = False
        t2 = time.thread_time()
        n = int(np.asarray(device).size)
        if _metrics["first_s"] is None:
            _metrics["first_s"] = t1 - t0
        elif n >= 1 << 14:  # cost per element of outputs large enough for it to mean something
            _metrics["kernel_s"] += t1 - t0
            _metrics["numpy_s"] += t2 - t1
            _metrics["elements"] += n
        _metrics["rows"] += 1
        problem = row_difference(fast, slow)
        if problem:
            _metrics["mismatches"].append({"name": name, "dtype": kwargs.get("device_dtype"), "n": n,
                                           "what": problem})
        return fast

    fused.supported = only_compiled
    standards.compare_tensor = rows


def row_difference(fast: Any, slow: Any) -> str:
    """What differs between two rows of msprobe's metrics beyond stats.py's tolerances ('' if nothing)."""
    def key(x: Any) -> Any:
        return ("nan" if math.isnan(x) else (x, math.copysign(1.0, x))) if isinstance(x, float) else x

    for attr in ("status", "message", "algorithm", "bench_dtype", "device_dtype", "shape"):
        if getattr(fast, attr) != getattr(slow, attr):
            return attr
    if {k: key(v) for k, v in (fast.worst or {}).items()} != {k: key(v) for k, v in (slow.worst or {}).items()}:
        return "worst"
    metrics: dict[str, Any] = fast.metrics
    for k, v in metrics.items():
        w = slow.metrics.get(k)
        if k in ("cosine", "mean_rel_err") and isinstance(v, float) and isinstance(w, float) and \
                math.isfinite(v) and math.isfinite(w):
            if abs(v - w) > (1e-12 if k == "cosine" else 1e-5) * max(abs(v), abs(w)):
                return k
        elif key(v) != key(w):
            return k
    return ""


def pytest_unconfigure(config: Any) -> None:
    if not hasattr(config, "workerinput"):
        report()


def report() -> None:
    """Print (and write to $VERIFY_STRICT_OUT) what was compared."""
    if not _totals["outputs"] and not _metrics["rows"]:
        return
    n = max(_totals["elements"], 1)
    m = max(_metrics["elements"], 1)
    metrics = {**_metrics, "kernel_ns_per_element": _metrics["kernel_s"] / m * 1e9,
               "numpy_ns_per_element": _metrics["numpy_s"] / m * 1e9}
    summary = {**_totals, "kernel_ns_per_element": _totals["kernel_s"] / n * 1e9,
               "numpy_ns_per_element": _totals["numpy_s"] / n * 1e9, "cpu": cpu_model(), "metrics": metrics}
    print(f"\nmsprobe's metrics on {metrics['rows']} rows ({metrics['elements']:,} elements of outputs of 16,384 "
          f"or more): {len(metrics['mismatches'])} mismatches; compiled {metrics['kernel_ns_per_element']:.2f} "
          f"ns/element, numpy {metrics['numpy_ns_per_element']:.2f} ns/element (CPU time, one thread); first "
          f"call {metrics['first_s'] or 0.0:.2f} s")
    for miss in metrics["mismatches"][:20]:
        print(f"  metrics mismatch: {miss}")
    print(f"\nstrict pass on {summary['outputs']} outputs ({summary['elements']:,} elements after the first): "
          f"{len(summary['mismatches'])} mismatches; compiled {summary['kernel_ns_per_element']:.2f} ns/element, "
          f"numpy {summary['numpy_ns_per_element']:.2f} ns/element (CPU time, one thread); first call "
          f"{summary['first_s'] or 0.0:.2f} s; {summary['cpu']}")
    out = os.environ.get("VERIFY_STRICT_OUT")
    if out:
        Path(out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    import runpy

    install()
    try:
        runpy.run_module("evals.planted_bugs", run_name="__main__", alter_sys=True)
    finally:
        report()
