"""A large item's memory estimate, left where the controller finds it if its worker dies while it runs.

A worker that the kernel kills for memory (SIGKILL) sends nothing: the controller knows only which item was
running. So before a check whose estimate is a large part of its memory budget starts its runs, the worker
writes that estimate to `<--msprobe-out>/.msprobe_inflight/<worker>.json`, and removes it once the item is done;
the crash report of that item quotes it (guard.CrashHooks). Torch-free: the controller imports it.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ..runs.memory import gib

DIR_NAME = ".msprobe_inflight"
LARGE = 8  # an estimate of at least 1/LARGE of the budget is written: only those can take the host's memory


def _path(out_dir: Path, worker: str) -> Path:
    return out_dir / DIR_NAME / f"{worker}.json"


class Estimates:
    """A worker's listener for one item's estimates (runs.memory.hear_estimates): a large one is written (its file
    path made only then: every item of a run makes one of these)."""

    def __init__(self, out_dir: Path, worker: str, nodeid: str) -> None:
        self.out_dir, self.worker, self.nodeid = out_dir, worker, nodeid
        self.written: Path | None = None

    def __call__(self, need: int, budget: int) -> None:
        if need * LARGE < budget:
            return
        path = _path(self.out_dir, self.worker)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"nodeid": self.nodeid, "need": need, "budget": budget}))
            self.written = path
        except OSError:
            pass  # a read-only results folder: the crash report names no estimate

    def close(self) -> None:
        if self.written is not None:
            self.written.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # another worker's estimate is still there
                self.written.parent.rmdir()


def worker() -> str | None:
    """This process's xdist worker id, None outside a worker (no crash report to tell)."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def crash_note(out_dir: Path, worker: str, nodeid: str) -> str:
    """What the dead worker left of the item it was running: its estimate and budget, or "" (none written)."""
    path = _path(out_dir, worker)
    try:
        left = json.loads(path.read_text())
        path.unlink()
    except (OSError, ValueError):
        return ""
    if not isinstance(left, dict) or left.get("nodeid") != nodeid:
        return ""
    return (f"; its check was estimated to need {gib(left['need'])} beside the device side, within a memory budget "
            f"of {gib(left['budget'])} (--msprobe-max-memory); if the host ran out of memory, a lower budget checks "
            "it in pieces, and fewer workers (-n) share the host's")
