"""The thread between the capture and the worker processes: each captured call becomes a one-call tensor dump
(online/spool.py) that a worker checks by the one protocol in replay mode (online/checking.py's CheckerPool),
and each answer becomes the call's record. Only the dump's entry goes to disk: its tensors, the host copies the
capture made, reach the worker through shared memory (torch.multiprocessing's reductions move their storage
there once), and are written as files only when the call is kept.

The feeder owns the pool and the spool folder; the capturing thread only puts calls in and the records come
out in `records`, by the call's sequence number. A call is given back to the byte budget once its record is
in, and its folder is deleted unless it is kept (`keep`). Whatever stops the checking (the workers die as they
start, a write fails) marks the calls left as not checked, and the feeder goes on draining the queue, so the
training step never waits on a check that cannot come.
"""
from __future__ import annotations

import shutil
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ..online import spool
from ..online.checking import CheckerPool, listed_skip, online_specs
from ..online.safeload import ApiData
from ..records.record import Record
from ..runs.memory import release_freed_memory
from ..settings import CheckOptions
from .outputs import placed
from .queue import Budget, Calls

POLL_S = 0.05
# The heap's free pages go back to the system at most this often once a call is done. glibc keeps what the
# calls' small copies free in the heap, and the step's process peaked some 150 MiB over its own peak plus the
# queue's bound; trimming as calls finish keeps it within 15 MiB of that (benchmarks/bench_in_training.py).
TRIM_EVERY_S = 0.25


def not_checked(name: str, why: str, status: str = "error") -> Record:
    """The record of a call whose check never finished: `status` error when a worker died with it (as the
    online session records a crash), SKIP when it was never sent (the queue was full)."""
    record = Record(name, spool.DIRECTION, 0, status=status, message=f"not checked: {why}")
    record.not_checked = True
    return record


class Captured(NamedTuple):
    """A call as the capturing thread hands it over: its place in capture order, its host copy, the bytes it
    holds of the budget, its API name and the device type that ran it."""

    sequence: int
    call: ApiData
    nbytes: int
    api: str
    device: str


@dataclass
class Sent:
    """What the feeder knows of a call it sent to a worker."""

    name: str
    nbytes: int
    folder: Path
    api: str
    step: int
    rank: int
    held: dict[str, Any] = field(default_factory=dict)  # its tensors by data_name, in memory until its record


@dataclass
class Feeder:
    """Started by `start()`, ended by closing `calls` and `join()`; `records` then holds every call's record."""

    calls: Calls
    budget: Budget
    out: Path  # the block's folder: the spool is its calls/, the records name its dump/
    base: CheckOptions  # the workers' options; recorded_on "auto": the first call's tensors tell
    workers: int
    keep: Callable[[str, Record], bool]  # (API, record) -> whether its one-call dump stays
    timeout: float | None = None
    records: dict[int, Record] = field(default_factory=dict)
    sent: dict[int, Sent] = field(default_factory=dict)
    kept: dict[int, Path] = field(default_factory=dict)  # sequence -> the one-call dump that stays
    error: str | None = None
    pool: Any = None
    _thread: threading.Thread | None = None
    _trimmed: float = 0.0  # when the heap was last trimmed (time.monotonic)

    def start(self) -> None:
        """The workers start now (their imports take seconds), the feeder thread too."""
        import torch.multiprocessing  # noqa: F401  # its reductions send the tensors through shared memory

        self.specs = online_specs(self.base.specs_file)
        self.options: CheckOptions | None = None  # the base, told the recording device by the first call
        try:
            self.pool = CheckerPool(self.workers, self.base, timeout=self.timeout)
        except Exception as exc:
            self.error = f"the worker processes cannot start: {type(exc).__name__}: {exc}".splitlines()[0]
        self._thread = threading.Thread(target=self._run, name="msprobe-inprocess-feeder", daemon=True)
        self._thread.start()

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join()
        if self.pool is not None:
            self.pool.close()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # never leave the step waiting on the budget: what is left is not checked
            self.error = traceback.format_exc().strip().splitlines()[-1]
            for sequence, sent in list(self.sent.items()):
                self._finish(sequence, sent, not_checked(sent.name, self.error))
            self.sent.clear()
            while not (self.calls.closed and not len(self.calls)):
                item = self.calls.get(POLL_S)
                if item is not None:
                    self._finish(item.sequence, _unsent(item), not_checked(item.call.name, self.error))

    def _loop(self) -> None:
        while True:
            item = self.calls.get(POLL_S if self.sent else 0.2)
            if item is not None:
                self._take(item)
            if self.sent:
                self._collect(0.0 if item is not None else POLL_S)
            elif item is None and self.calls.closed and not len(self.calls):
                return

    def _take(self, item: Captured) -> None:
        sequence, call = item.sequence, item.call
        sent = _unsent(item, self.out / "calls" / f"step{call.step}" / f"rank{call.rank}" / call.name)
        if self.error is not None:
            self._finish(sequence, sent, not_checked(call.name, self.error))
            return
        reason = listed_skip(call, item.api, self.specs)  # inputs copied before the call: no changed_input
        if reason is not None:
            self._finish(sequence, sent, Record(call.name, spool.DIRECTION, 0, status="SKIP", message=reason))
            return
        folder = sent.folder
        try:
            dump_json, _ = spool.write(call, folder, held=sent.held)  # the entry on disk, the tensors in memory
            self.pool.submit(sequence, dump_json, spool.entry_name(call), self._options(item.device), sent.held)
        except Exception as exc:  # a full disk, workers that cannot start: nothing more can be checked
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            shutil.rmtree(folder, ignore_errors=True)
            self._finish(sequence, sent, not_checked(call.name, self.error))
            return
        self.sent[sequence] = sent

    def _options(self, device: str) -> CheckOptions:
        if self.options is None:
            told = self.base.recorded_on if self.base.recorded_on != "auto" else device
            self.options = replace(self.base, recorded_on=told)
        return self.options

    def _collect(self, timeout: float) -> None:
        try:
            answers = self.pool.results(timeout)
        except Exception:
            self.error = traceback.format_exc().strip().splitlines()[-1]
            answers = [(sequence, ("crashed", self.error)) for sequence in list(self.sent)]
        for sequence, (kind, value) in answers:
            sent = self.sent.pop(sequence)
            if kind == "ok":
                record = value
            elif kind == "raised":
                record = Record(sent.name, spool.DIRECTION, 0, status="error",
                                message="the check raised in a worker process")
                record.traceback = value
            else:
                record = not_checked(sent.name, value)
            if not record.not_checked and self.keep(sent.api, record):
                spool.save_held(sent.held, sent.folder)
                self.kept[sequence] = sent.folder
            else:
                shutil.rmtree(sent.folder, ignore_errors=True)
            self._finish(sequence, sent, record)

    def _finish(self, sequence: int, sent: Sent, record: Record) -> None:
        self.records[sequence] = placed(record, self.out, sent.step, sent.rank)
        sent.held.clear()
        self.budget.release(sent.nbytes)
        now = time.monotonic()
        if now - self._trimmed >= TRIM_EVERY_S:
            self._trimmed = now
            release_freed_memory(0)


def _unsent(item: Captured, folder: Path = Path()) -> Sent:
    return Sent(item.call.name, item.nbytes, folder, item.api, item.call.step, item.call.rank)

