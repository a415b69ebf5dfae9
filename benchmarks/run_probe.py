"""A pytest plugin that records where each process of a run spends its wall and CPU time
(`-p benchmarks.run_probe`, with MSPROBE_RUN_PROBE_DIR naming a directory; benchmarks/bench_phases.py).

Every process (the controller, each xdist worker, or the one process of `-n 0`) writes
`<worker id or "main">.json` there at pytest_unconfigure: (wall, CPU) marks at its start (from
/proc/self/stat), when this plugin was imported (Python and pytest started), after pytest_configure
(plugins loaded and configured), after collection, around its items (the first item's `import torch`
and `import numba` are done here, timed, before the item runs; they would be its first work
otherwise), around pytest_sessionfinish (msprobe writes its files there) and pytest_unconfigure. Items:
their count, summed wall and CPU, and the phases of their records; the controller's received-report
count and bytes. CPU is
user+system of the whole process (getrusage), so a helper thread's time counts. Linux only.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_vs_msprobe import PHASES, add_phases

ENV = "MSPROBE_RUN_PROBE_DIR"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_start() -> float:
    """The wall time this process started (Linux: /proc/self/stat's start time after boot)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


marks: dict[str, tuple[float, float]] = {"start": (_process_start(), 0.0), "probe_imported": (time.time(), _cpu())}
counts: dict[str, float] = {"items": 0, "items_wall": 0.0, "items_cpu": 0.0, "reports": 0, "report_bytes": 0}
phases = dict.fromkeys(PHASES, 0.0)


def _mark(name: str) -> None:
    marks[name] = (time.time(), _cpu())


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    _mark("configured")


def pytest_collection_finish(session: pytest.Session) -> None:
    _mark("collected")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Any) -> None:
    """The controller: the last worker's collection is what the first item waits for."""
    _mark("collected")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    if "first_item" not in marks:
        _mark("first_item")
        import torch  # noqa: F401

        _mark("torch_imported")
        import numba  # noqa: F401

        _mark("numba_imported")
    wall, cpu = time.time(), _cpu()
    try:
        return (yield)
    finally:
        counts["items"] += 1
        counts["items_wall"] += time.time() - wall
        counts["items_cpu"] += _cpu() - cpu
        _mark("last_item_done")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Where the item ran: the phases of its record (`timings`), summed as bench_vs_msprobe sums them."""
    report = yield
    record = getattr(report, "msprobe", None)
    if isinstance(record, dict) and isinstance(record.get("timings"), dict):
        add_phases(phases, record["timings"])
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_newgateway(gateway: Any) -> None:
    marks.setdefault("first_worker_started", (time.time(), _cpu()))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The controller under xdist: every report a worker sent (its bytes as the worker packed them)."""
    node = getattr(report, "node", None)
    if node is None:
        return
    counts["reports"] += 1
    counts["report_bytes"] += getattr(report, "_probe_bytes", 0)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_report_from_serializable(config: pytest.Config, data: dict[str, Any]) -> Generator[None, Any, Any]:
    size = len(data["msprobe_packed"]) if isinstance(data.get("msprobe_packed"), str) else len(json.dumps(
        data, default=str))
    report = yield
    if report is not None:
        report._probe_bytes = size
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, Any, Any]:
    _mark("sessionfinish_start")
    try:
        return (yield)
    finally:
        _mark("sessionfinish_done")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> Generator[None, Any, Any]:
    _mark("unconfigure_start")
    try:
        return (yield)
    finally:
        _mark("unconfigure_done")
        out = os.environ.get(ENV)
        if out:
            worker = getattr(config, "workerinput", {}).get("workerid", "main")
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            Path(out, f"{worker}.json").write_text(json.dumps(
                {"marks": marks, "counts": counts, "phases": phases, "peak_rss_mib": peak, "pid": os.getpid(),
                 "modules": len(sys.modules)}))
