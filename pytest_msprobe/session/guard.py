"""Hung and crashing items fail with a record, and the run goes on.

Timeout (ini `msprobe_timeout`), two layers because a hung device call may never return to Python:

* SIGALRM after T seconds (main thread, POSIX) raises `ItemTimeout` inside the item: the item fails
  cleanly and the process carries on. It cannot interrupt a native call that blocks or masks signals.
* faulthandler's watchdog (a C thread, so it needs no GIL) fires `GRACE_S` later: it dumps every
  thread's stack to stderr and exits the process. Under xdist that is a worker crash: xdist starts a
  replacement and the controller records the item as failed. Without xdist it ends the run; the
  journal keeps every finished result for `--msprobe-resume`.

Crash: xdist reports the item a dead worker was running through `pytest_handlecrashitem`; the
controller turns it into an error record ("worker crashed while running <API>"), so it reaches the
CSVs like any other result.

Ctrl-C (`interrupted`): the helper thread's calls are no longer wanted, so they stop (helper.stop) and the process
exits without waiting for them; an interrupt that lands while this thread waits (for the helper's result, a lock, a
queue) is reported where it waited, not in threading.py.
"""
from __future__ import annotations

import concurrent.futures
import faulthandler
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from ..dump.reader import load_dump, parse_entry_name
from ..helper import stop
from ..inputs.seeds import item_seed
from ..records.record import Record
from . import ini_keys
from .inflight import crash_note
from .items import ApiItem
from .stash import SETTINGS_KEY

GRACE_S = 2.0
STACK_SHOWN = 6  # innermost frames of a timed-out item's stack


class ItemTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so no `except Exception` in API code can swallow it."""


def failure_record(nodeid: str, message: str, run_seed: int, order: int | None = None,
                   rootpath: Path | None = None) -> Record | None:
    """An error record for an item that produced none (crash, timeout, exception outside the check)."""
    path, _, name = nodeid.rpartition("::")
    try:
        parsed = parse_entry_name(name)
    except ValueError:
        return None
    if order is None:  # the controller has no items under xdist; the dump tells the position
        try:
            order = load_dump(Path(rootpath or ".") / path).entry_names().index(name)
        except Exception:
            order = 0
    record = Record(parsed.full_name, parsed.direction, item_seed(run_seed, parsed.full_name), status="error",
                    message=message)
    record.nodeid, record.dump, record.order = nodeid, path, order
    return record


def record_for_exception(item: ApiItem, call: pytest.CallInfo[None],
                         report: pytest.TestReport) -> Record | None:
    """The record of an item whose call raised before the check made one (a timeout, a device error)."""
    excinfo = call.excinfo
    if excinfo is None or excinfo.errisinstance((pytest.skip.Exception, pytest.xfail.Exception)):
        return None
    timeout = excinfo.errisinstance(ItemTimeout)
    message = str(excinfo.value) if timeout else excinfo.exconly().strip()
    record = failure_record(item.nodeid, message, item.config.stash[SETTINGS_KEY].check_options.run_seed,
                            order=item.order)
    if record is not None:
        frames = [f for f in traceback.extract_tb(excinfo.tb)
                  if f.filename != __file__ and not any(p in f.filename for p in ("/pluggy/", "/_pytest/"))]
        where = "".join(traceback.format_list(frames[-STACK_SHOWN:]))
        record.traceback = where
        if timeout:  # where it hung, not pytest's frames
            report.longrepr = f"{message}; it was here:\n{where}"
    return record


class Timeout:
    """Arms both layers around each item's call phase."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.use_alarm = hasattr(signal, "setitimer")
        # the real stderr, taken while output capture is suspended (as pytest's faulthandler plugin does)
        self.stderr = os.fdopen(os.dup(sys.__stderr__.fileno() if sys.__stderr__ else 2), "w")

    def pytest_unconfigure(self) -> None:
        self.stderr.close()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        from ..check import rerun as check  # noqa: F401  torch's first import is not the item's time

        alarm = self.use_alarm and threading.current_thread() is threading.main_thread()
        if alarm:
            previous = signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        faulthandler.dump_traceback_later(self.seconds + GRACE_S, exit=True, file=self.stderr)
        try:
            return (yield)
        finally:
            faulthandler.cancel_dump_traceback_later()
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

    def _expired(self, signum: int, frame: Any) -> None:
        raise ItemTimeout(f"timed out after {self.seconds:g} s (msprobe_timeout)")


class CrashHooks:
    """Controller side under xdist: a crashed item becomes a failed item with an error record."""

    def __init__(self, run_seed: int, timeout: float | None, rootpath: Path, out_dir: Path) -> None:
        self.run_seed, self.timeout, self.rootpath, self.out_dir = run_seed, timeout, rootpath, out_dir
        self.started: dict[str, float] = {}
        self.crashed = 0

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.started[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.started.pop(nodeid, None)

    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        elapsed = time.monotonic() - self.started.pop(crashitem, time.monotonic())
        api = crashitem.rpartition("::")[2]
        worker = getattr(getattr(report, "node", None), "gateway", None)
        worker_id = getattr(worker, "id", "?")
        if self.timeout is not None and elapsed >= self.timeout:
            message = (f"timed out after {self.timeout:g} s (msprobe_timeout): the watchdog stopped worker "
                       f"{worker_id} while running {api}")
        else:
            message = f"worker crashed while running {api} (worker {worker_id} died)" + \
                crash_note(self.out_dir, str(worker_id), crashitem)  # what a check too large left there
        record = failure_record(crashitem, message, self.run_seed, rootpath=self.rootpath)
        if record is None:  # not a dump item: xdist's own report stands
            return
        record.crashed = True
        report.msprobe = record  # type: ignore[attr-defined]
        report.longrepr = message
        report.location = (crashitem.rpartition("::")[0], 0, f"msprobe: {api}")  # the failure heading
        self.crashed += 1


CRASH_KEY = pytest.StashKey[CrashHooks]()


# where a waiting thread's interrupt lands: the frames pytest would name as its place
_WAITING_IN = (threading.__file__, queue.__file__, os.path.dirname(concurrent.futures.__file__) + os.sep)


class Interrupted:
    """Every process: Ctrl-C stops the helper while pytest reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)  # before the terminal formats the traceback
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        interrupted(excinfo, bool(self.config.option.fulltrace))


def interrupted(excinfo: pytest.ExceptionInfo[BaseException], full_trace: bool) -> None:
    """Ctrl-C or pytest.exit in this process (a worker's too): stop the helper, and name the place of the interrupt
    without the frames of the wait it landed in. Without --full-trace pytest shows only that place, so only it is
    kept: formatting the rest, source and all, took seconds of a deep traceback through torch."""
    stop()
    frames = excinfo.traceback
    keep = len(frames)
    while keep > 1 and str(frames[keep - 1].path).startswith(_WAITING_IN):
        keep -= 1
    place = frames[keep - 1] if keep else None
    if not full_trace and place is not None and not _hides(place.frame):
        excinfo.traceback = frames[keep - 1:keep]
    elif keep < len(frames):
        excinfo.traceback = frames[:keep]


def _hides(frame: Any) -> bool:
    """The frame asks pytest to leave it out of tracebacks (then pytest's own choice of the place stands)."""
    return "__tracebackhide__" in frame.f_locals or "__tracebackhide__" in frame.f_globals


def configure(config: pytest.Config, run_seed: int) -> None:
    """Timeout where items run; crash records on the xdist controller."""
    value = ini_keys.value(config, "msprobe_timeout")
    try:
        timeout = float(value) if value is not None else None
    except ValueError:
        timeout = -1.0
    if timeout is not None and not timeout > 0:
        raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_timeout')}: {value!r} is not a positive number "
                                "of seconds")
    config.pluginmanager.register(Interrupted(config), "msprobe-interrupted")
    distributed = bool(getattr(config.option, "tx", None))
    if timeout is not None and (hasattr(config, "workerinput") or not distributed):
        config.pluginmanager.register(Timeout(timeout), "msprobe-timeout")
    if distributed and not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist"):
        config.stash[CRASH_KEY] = CrashHooks(run_seed, timeout, config.rootpath, config.stash[SETTINGS_KEY].out_dir)
        config.pluginmanager.register(config.stash[CRASH_KEY], "msprobe-crash")
