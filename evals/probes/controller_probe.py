"""Where the xdist controller's CPU goes, by cause: a pytest plugin for the controller process only.

    MSPROBE_CONTROLLER_PROBE=ctl.jsonl PYTHONPATH=. python -m pytest -p evals.probes.controller_probe DUMP_JSON \
        --msprobe-device cpu -n 2
    python -m evals controller_probe ctl.jsonl          # one table per run

At `-n 2` the controller receives every worker's reports (three per item), schedules the items, keeps the
journal and writes the result files; on a machine with as many cores as workers its CPU is taken from the
workers. This plugin wraps, in the controller only, the functions each cause runs in (execnet's message
decoding in the receiving threads, xdist's event handlers on the main thread, pytest's report hooks, the
package's scheduler, journal and file writer) and sums the CPU of the thread that ran each call
(`time.thread_time`): inclusive times, so an outer cause holds the inner ones named below it. It adds
about 1 us per wrapped call. Each run appends one JSON line: the process's CPU when configured (start-up)
and at the end, the main thread's CPU, and {cause: [calls, CPU s]}. Linux or any POSIX system.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest

ENV = "MSPROBE_CONTROLLER_PROBE"
_TOTALS: dict[str, list[float]] = {}
_START: list[float] = []


def _add(label: str, seconds: float) -> None:
    entry = _TOTALS.setdefault(label, [0, 0.0])
    entry[0] += 1
    entry[1] += seconds


def _wrap(owner: Any, name: str, label: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(label, time.thread_time() - start)

    setattr(owner, name, timed)


def _hook(label: str) -> Callable[..., Generator[None, Any, Any]]:
    def hook() -> Generator[None, Any, Any]:
        start = time.thread_time()
        try:
            return (yield)
        finally:
            _add(label, time.thread_time() - start)

    return hook


class HookTimes:
    """Every plugin's implementations of a hook together (a wrapper outside them all)."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_report_from_serializable(self) -> Generator[None, Any, Any]:
        return (yield from _hook("receiver: report_from_serializable hooks (all plugins)")())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self) -> Generator[None, Any, Any]:
        return (yield from _hook("main: runtest_logreport hooks (all plugins)")())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_report_teststatus(self) -> Generator[None, Any, Any]:
        return (yield from _hook("main: report_teststatus hooks (all plugins)")())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self) -> Generator[None, Any, Any]:
        return (yield from _hook("main: sessionfinish hooks (all plugins)")())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self) -> Generator[None, Any, Any]:
        return (yield from _hook("main: terminal_summary hooks (all plugins)")())


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None) or not os.environ.get(ENV):
        return
    times = os.times()
    _START.append(times.user + times.system)
    import execnet.gateway_base as gateway
    import xdist.dsession as dsession
    import xdist.workermanage as workermanage
    from _pytest.reports import TestReport

    from pytest_msprobe.records import wire
    from pytest_msprobe.reports import results
    from pytest_msprobe.session import journal, schedule

    _wrap(gateway, "loads_internal", "receiver: execnet decodes a message")
    _wrap(workermanage.WorkerController, "process_from_remote", "receiver: xdist handles a message (hooks)")
    _wrap(wire, "unpack", "receiver: ours, wire.unpack (json.loads of a report)")
    _wrap(TestReport, "_from_json", "receiver: pytest's TestReport._from_json")
    _wrap(dsession.DSession, "loop_once", "main: xdist's event loop (all events)")
    _wrap(dsession.DSession, "worker_testreport", "main: testreport events (logreport hooks)")
    _wrap(dsession.DSession, "worker_logstart", "main: logstart events")
    _wrap(dsession.DSession, "worker_logfinish", "main: logfinish events")
    _wrap(dsession.DSession, "worker_runtest_protocol_complete", "main: protocol_complete events (scheduler)")
    _wrap(dsession.DSession, "worker_collectionfinish", "main: collectionfinish events (first schedule)")
    _wrap(schedule.CostScheduling, "_estimate", "main: ours, the items' costs from the dump")
    _wrap(schedule.CostScheduling, "mark_test_complete", "main: ours, scheduler per item")
    _wrap(journal.Journal, "write", "main: ours, journal.write")
    _wrap(results, "write_results", "main: ours, write_results (CSVs, JSON lines)")
    config.pluginmanager.register(HookTimes(), "msprobe-controller-probe-hooks")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _START:
        return
    times = os.times()
    line = {"start_up_cpu": _START[0], "process_cpu": times.user + times.system, "main_thread_cpu": time.thread_time(),
            "causes": {k: [int(v[0]), round(v[1], 4)] for k, v in sorted(_TOTALS.items())}}
    with open(os.environ[ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def main() -> None:
    for text in open(sys.argv[1], encoding="utf-8"):
        run = json.loads(text)
        print(f"controller CPU {run['process_cpu']:.2f} s: start-up {run['start_up_cpu']:.2f}, main thread "
              f"{run['main_thread_cpu']:.2f}, other threads {run['process_cpu'] - run['main_thread_cpu']:.2f}")
        for cause, (calls, cpu) in run["causes"].items():
            print(f"  {cpu:8.3f} s {calls:6d} calls  {cause}")


if __name__ == "__main__":
    main()
