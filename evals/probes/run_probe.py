"""A pytest plugin that records where each process of a run spends its wall and CPU time
(`-p evals.probes.run_probe`, with MSPROBE_RUN_PROBE_DIR naming a directory; `python -m benchmarks bench_phases`).

Every process (the controller, each xdist worker, or the one process of `-n 0`) writes
`<worker id or "main">.json` there at pytest_unconfigure: (wall, CPU) marks at its start (from
/proc/self/stat), when this plugin was imported (Python and pytest started), after pytest_configure
(plugins loaded and configured), after collection, around its items (the first item's `import torch`
and `import numba` are done here, timed, before the item runs, with the cyclic collector paused as the
plugin pauses it; they would be its first work otherwise), around pytest_sessionfinish (msprobe writes
its files there) and pytest_unconfigure. Items: their count, summed wall and CPU, and the phases of
their records; the controller's received-report count and bytes. CPU is user+system of the whole
process (getrusage), so a helper thread's time counts. Linux only.

With MSPROBE_RUN_PROBE_DETAIL=1 (bench_phases.py --detail) also "steps": what the items' (main) thread
spends in each hook of pytest's protocol (every plugin's implementations together, and the package's own
implementations apart: "ours: ..."), in the package's
functions an item calls outside its timed phases (DETAIL: they are wrapped at the first item) and in the
cyclic collector's passes; per step its calls, wall, that thread's CPU and the longest call. Wall well
above CPU is time the thread waited: for the GIL (the helper thread), the disk or a busy machine.
"""
from __future__ import annotations

import functools
import gc
import importlib
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from evals.probes.phases import PHASES, add_phases
from pytest_msprobe.records.record import Record

ENV = "MSPROBE_RUN_PROBE_DIR"
DETAIL_ENV = "MSPROBE_RUN_PROBE_DETAIL"  # "1": also time the steps of each item (below)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_start() -> float:
    """The wall time this process started (Linux: /proc/self/stat's start time after boot, against
    /proc/uptime now: both count from boot to 10 ms; /proc/stat's btime is whole seconds, which put up to
    1 s more into every process's start-up)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


marks: dict[str, tuple[float, float]] = {"start": (_process_start(), 0.0), "probe_imported": (time.time(), _cpu())}
counts: dict[str, float] = {"items": 0, "items_wall": 0.0, "items_cpu": 0.0, "reports": 0, "report_bytes": 0}
phases = dict.fromkeys(PHASES, 0.0)
# step -> [calls, wall s, CPU s of the calling thread, longest call s], only what the items' (main) thread spends
steps: dict[str, list[float]] = {}


def _add_step(name: str, wall: float, cpu: float, calls: int = 1) -> None:
    row = steps.setdefault(name, [0, 0.0, 0.0, 0.0])
    row[0] += calls
    row[1] += wall
    row[2] += cpu
    row[3] = max(row[3], wall)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, its calls from the main thread timed under `name` (the helper thread's calls are not). A call
    that returns True is also counted under "<name>: True" (release_freed_memory: the items that trimmed)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        wall, cpu = time.perf_counter(), time.thread_time()
        result: Any = None
        try:
            result = fn(*args, **kwargs)
            return result
        finally:
            spent = time.perf_counter() - wall, time.thread_time() - cpu
            _add_step(name, *spent)
            if result is True:
                _add_step(f"{name}: True", *spent)
    return wrapper


def _timed_generator(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A hook wrapper (a generator function) whose own code, before and after its yield, is timed under
    `name`; what it wraps (the yield) is not."""
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Generator[Any, Any, Any]:
        wall, cpu = time.perf_counter(), time.thread_time()
        gen = fn(*args)
        try:
            value = next(gen)
        finally:
            _add_step(name, time.perf_counter() - wall, time.thread_time() - cpu)
        try:
            sent = yield value
        except BaseException as exc:  # what the wrapped hooks raised goes to the wrapper
            resume: Callable[[], Any] = functools.partial(gen.throw, exc)
        else:
            resume = functools.partial(gen.send, sent)
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            resume()
        except StopIteration as stop:
            return stop.value
        finally:
            _add_step(name, time.perf_counter() - wall, time.thread_time() - cpu, calls=0)
        raise RuntimeError(f"{fn.__qualname__} yielded twice")
    return wrapper


PROTOCOL_HOOKS = ("pytest_runtest_logstart", "pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown",
                  "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_runtest_logfinish")


def _time_our_hookimpls(config: pytest.Config) -> None:
    """The package's own implementations of each protocol hook, timed apart ("ours: makereport (plugin)"):
    the rest of a hook's time is pytest's and other plugins'."""
    for hook_name in PROTOCOL_HOOKS:
        for impl in getattr(config.pluginmanager.hook, hook_name).get_hookimpls():
            module = getattr(impl.function, "__module__", "") or ""
            if not module.startswith("pytest_msprobe"):
                continue
            step = f"  ours: {hook_name.removeprefix('pytest_runtest_')} ({impl.plugin_name})"
            timed = _timed_generator if impl.wrapper or impl.hookwrapper else _timed
            impl.function = timed(step, impl.function)


# (module, attribute, step): the functions an item calls outside its timed phases, where they are looked up
DETAIL = (
    ("pytest_msprobe.session.items", "load_dump", "load_dump (item)"),
    ("pytest_msprobe.session.journal", "load_dump", "load_dump (journal entry_key)"),
    ("pytest_msprobe.specs.loader", "load_specs", "load_specs"),
    ("pytest_msprobe.check.prepare", "prefetch", "prefetch (next item's inputs submitted)"),
    ("pytest_msprobe.runs.memory", "release_freed_memory", "release_freed_memory"),
    ("pytest_msprobe.check", "check_entry", "check_entry"),
    ("pytest_msprobe.check.rerun", "checkable_entries", "  entries parsed, skip lists"),
    ("pytest_msprobe.check.placement", "resolve", "  resolve the API"),
    ("pytest_msprobe.check.precision", "plan_precision", "  plan_precision"),
    ("pytest_msprobe.check.rerun", "prepared_inputs", "  prepared_inputs (in inputs_s)"),
    ("pytest_msprobe.check.placement", "make_side", "  make_side, device and bench (in inputs_s)"),
    ("pytest_msprobe.check.execute", "third_run", "  third_run: the reference side made"),
    ("pytest_msprobe.check.execute", "seed_random_apis", "  seed_random_apis"),
    ("pytest_msprobe.check.execute", "start_metrics", "  start_metrics (submitted)"),
    ("pytest_msprobe.check.rerun", "start_metrics", "  start_metrics (submitted)"),
    ("pytest_msprobe.check.execute", "output_leaves", "  output_leaves"),
    ("pytest_msprobe.check.rerun", "compare_outputs", "  compare_outputs (in compare_s)"),
    ("pytest_msprobe.check.rerun", "finish_record", "  finish_record"),
    ("pytest_msprobe.runs.capture", "stash", "  capture.stash"),
    ("pytest_msprobe.session.items", "junit_properties", "junit_properties"),
    ("pytest_msprobe.session.items", "rerun_command", "rerun_command"),
    ("pytest_msprobe.session.journal", "entry_key", "journal entry_key"),
)


def _untimed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """check_entry, with the part of its wall time that its record's timings do not hold as a step (the
    inputs, device, bench, reference and compare phases are timed inside it; compare_s spans the backward)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall = time.perf_counter()
        record = fn(*args, **kwargs)
        timings = record.timings
        timed = sum(timings.get(k, 0.0) for k in ("inputs_s", "device_s", "bench_s", "reference_s", "compare_s"))
        if threading.current_thread() is threading.main_thread():
            _add_step("  check_entry outside its record's timings", time.perf_counter() - wall - timed, 0.0)
        return record
    return wrapper


def _install_detail() -> None:
    for module_name, attr, step in DETAIL:
        module = importlib.import_module(module_name)
        setattr(module, attr, _timed(step, getattr(module, attr)))
    check = importlib.import_module("pytest_msprobe.check")
    check.check_entry = _untimed(check.check_entry)  # type: ignore[attr-defined]
    from pytest_msprobe.session.journal import Journal

    Journal.write = _timed("journal write", Journal.write)  # type: ignore[method-assign]
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:  # the cyclic collector's passes in the main thread
        if threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
        elif started:
            _add_step(f"gc (generation {info['generation']})", time.perf_counter() - started[0],
                      time.thread_time() - started[1])

    gc.callbacks.append(on_gc)


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
        from pytest_msprobe.session.devices import long_lived  # as the plugin imports them: no cyclic GC

        _mark("first_item")
        with long_lived():
            import torch  # noqa: F401
        _mark("torch_imported")
        with long_lived():
            import numba  # noqa: F401
        _mark("numba_imported")
        if os.environ.get(DETAIL_ENV) == "1":
            _install_detail()  # imports the check modules (and warms nothing): before the items' timing
            _time_our_hookimpls(item.config)
            _mark("detail_installed")
    wall, cpu = time.time(), _cpu()
    try:
        return (yield)
    finally:
        counts["items"] += 1
        counts["items_wall"] += time.time() - wall
        counts["items_cpu"] += _cpu() - cpu
        _mark("last_item_done")


def _hook_timer(name: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return (yield)
        finally:
            if "first_item" in marks:
                _add_step(name, time.perf_counter() - wall, time.thread_time() - cpu)
    return wrapper


# the whole of each hook of an item's protocol, every plugin's implementation included
pytest_runtest_logstart = pytest.hookimpl(wrapper=True, tryfirst=True)(_hook_timer("hook: logstart"))
pytest_runtest_setup = pytest.hookimpl(wrapper=True, tryfirst=True)(_hook_timer("hook: setup"))
pytest_runtest_call = pytest.hookimpl(wrapper=True, tryfirst=True)(_hook_timer("hook: call (runtest)"))
pytest_runtest_teardown = pytest.hookimpl(wrapper=True, tryfirst=True)(_hook_timer("hook: teardown"))
pytest_runtest_logfinish = pytest.hookimpl(wrapper=True, tryfirst=True)(_hook_timer("hook: logfinish"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Where the item ran: the phases of its record (`timings`), summed as bench_vs_msprobe sums them."""
    wall, cpu = time.perf_counter(), time.thread_time()
    report = yield
    _add_step("hook: makereport", time.perf_counter() - wall, time.thread_time() - cpu)
    record = getattr(report, "msprobe", None)
    if isinstance(record, Record):
        add_phases(phases, record.timings)
        _add_step("phases of the record", sum(record.timings.values()), 0.0)
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_newgateway(gateway: Any) -> None:
    marks.setdefault("first_worker_started", (time.time(), _cpu()))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> Generator[None, Any, Any]:
    """Timed (every plugin's: terminal, results, journal); the controller under xdist: every report a
    worker sent (its bytes as the worker packed them)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        return (yield)
    finally:
        _add_step("hook: logreport", time.perf_counter() - wall, time.thread_time() - cpu)
        if getattr(report, "node", None) is not None:
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
                {"marks": marks, "counts": counts, "phases": phases, "steps": steps, "peak_rss_mib": peak,
                 "pid": os.getpid(),
                 "modules": len(sys.modules)}))
