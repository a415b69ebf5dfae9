"""What the online session does with a received call besides receiving it: which calls have nothing to
compare (`skip_reason`: `listed_skip` and `changed_input`), the specs online calls are checked with (`online_specs`), the per-rank accounting
(`RankCounts`), and `CheckerPool`, the worker processes of `msprobe_online_workers` N.

A worker is a spawned process that imports torch once and runs the project's one check
(`check.check_entry` on the call's one-call tensor dump, the same call the in-process item makes) for
one call at a time; the session sends it the dump's path and gets the record back. The calls themselves
travel on disk (the spool), so a pipe carries a path out and a record in. A worker that dies while
checking (a segfaulting kernel, an out-of-memory kill) fails that call with a record saying so and a fresh
worker takes its place; a worker still busy after `timeout` seconds is stopped the same way. Pytest-free.
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from ..records.record import Record

STOP = None  # what the session sends a worker to end it


class WorkersFailed(RuntimeError):
    """The worker processes cannot run at all (three died before they were ready)."""


@dataclass
class RankCounts:
    received: int = 0
    checked: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    def line(self, rank: str) -> str:
        skipped, refused = sum(self.skipped.values()), sum(self.refused.values())
        return (f"msprobe online: {rank}: received {self.received} = checked {self.checked} + skipped {skipped} "
                f"+ refused {refused}")


def online_specs(specs_file: str | None) -> dict[str, Any]:
    """api_specs for online calls: Aten calls are run (a dump names aten overloads, which are skipped; the
    online client sends overload packets, `Aten.mm.1`)."""
    from ..specs.loader import load_specs

    specs = dict(load_specs(user_file=specs_file))
    specs["unsupported_types"] = {k: v for k, v in specs.get("unsupported_types", {}).items() if k != "Aten"}
    return specs


def check_call(dump_json: Path, entry_name: str, options: Any, specs: dict[str, Any],
               held: dict[str, Any] | None = None) -> Record:
    """The record of a received call's one-call dump: the check every online call gets, in the session's
    process or in a worker. `held`: its tensors by data_name, given in memory instead of as files."""
    from ..check import check_entry
    from ..dump.reader import load_dump
    from ..runs.memory import keep_freed_memory, release_freed_memory

    keep_freed_memory()
    dump = load_dump(dump_json)
    dump.held = held or {}
    try:
        return check_entry(dump, entry_name, options, specs)
    finally:
        dump.held = {}
        release_freed_memory()


def skip_reason(data: Any, api: str, specs: dict[str, Any]) -> str | None:
    """Why a received call has nothing to compare, decided before its tensors are written out."""
    return listed_skip(data, api, specs) or changed_input(data, api)


def listed_skip(data: Any, api: str, specs: dict[str, Any]) -> str | None:
    """The api_specs' reason to skip the call online (always_skip, online_skip), if any."""
    from ..specs.loader import in_list

    for group in ("always_skip", "online_skip"):
        if in_list(specs, api, group):
            return f"{data.name}: {specs[group]['reason']}"
    return None


def changed_input(data: Any, api: str) -> str | None:
    """Why an in-place call sent after it ran cannot be checked: its input is its output. (A client that copies
    the input before the call, as the in-process capture does, never needs this.)"""
    inplace = api.endswith("_") and not api.startswith("_")
    if inplace or "out" in data.kwargs:
        import torch

        inputs = [t for t in [*data.args, *data.kwargs.values()] if isinstance(t, torch.Tensor)]
        results = data.result if isinstance(data.result, (tuple, list)) else [data.result]
        stores = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
        if any(isinstance(r, torch.Tensor) and r.numel() and r.untyped_storage().data_ptr() in stores for r in results):
            return (f"{data.name}: in-place call sent after it changed its input (input and output share "
                    "storage): the input before the call is unknown, nothing to compare")
        first = data.args[0] if data.args else None
        out = results[0] if results else None
        if inplace and isinstance(first, torch.Tensor) and isinstance(out, torch.Tensor) and \
                first.shape == out.shape and first.dtype == out.dtype and torch.equal(first, out):
            return (f"{data.name}: in-place call whose input equals its output (sent after the call changed it, "
                    "as msprobe 8.1's nfs_path client does): nothing to compare")
    return None


# ------------------------------------------------------------------------------------------ worker processes

def serve(conn: Connection, options: Any, env: dict[str, str]) -> None:
    """A worker's life: take (dump.json, entry, options or None, tensors or None) until STOP, answer each with
    ("ok", record) or ("raised", traceback text); a task's own options replace the worker's for that call, and
    its tensors (shared memory, by data_name) its files. Ctrl-C reaches the whole process group: only the
    session acts on it."""
    import os

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)  # device pinning, before torch is imported
    import torch
    import torch.multiprocessing  # noqa: F401  # its reductions receive a task's tensors through shared memory

    from ..runs.backends import make_current

    torch.set_num_threads(options.threads)
    if options.device_index is not None:
        make_current(options.device, options.device_index)  # as the first item does in one process
    specs = online_specs(options.specs_file)
    from ..check.compare import warm_up

    warm_up(options.standard)  # the compiled checks load before the first call, not inside its timeout
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the session is gone
            return
        if task is STOP:
            return
        dump_json, entry_name, own, held = task
        try:
            answer: tuple[str, Any] = ("ok", check_call(Path(dump_json), entry_name, own or options, specs, held))
        except Exception:
            answer = ("raised", traceback.format_exc())
        conn.send(answer)


@contextlib.contextmanager
def _main_unnamed() -> Iterator[None]:
    """While a worker starts, the main module names no file: a spawned process imports the main script again
    unless it is told none, and a training script run as `python train.py` (checking itself in-process) need not
    guard its top level with `if __name__ == "__main__"`. The worker runs this module's `serve`, nothing of main."""
    main = sys.modules.get("__main__")
    saved = {key: main.__dict__.pop(key) for key in ("__file__",) if main is not None and key in main.__dict__}
    spec = getattr(main, "__spec__", None)
    if main is not None:
        main.__spec__ = None
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)
            main.__spec__ = spec


@dataclass(eq=False)  # hashable by identity
class _Worker:
    process: Any  # multiprocessing.Process of the spawn context
    conn: Connection
    number: int
    task: Any = None  # the key of the call it checks
    what: str = ""
    since: float = 0.0
    ready: bool = False


class CheckerPool:
    """`size` worker processes checking one call each at a time; results come back by key.

    `submit` queues a call (the caller bounds how many are out: the session's window); `results(timeout)` returns
    every (key, answer) that finished, where answer is ("ok", record), ("raised", traceback text) or ("crashed",
    message)."""

    def __init__(self, size: int, options: Any, slots: list[tuple[dict[str, str], int | None]] | None = None,
                 timeout: float | None = None) -> None:
        self.context = multiprocessing.get_context("spawn")  # no fork of a process with threads and torch
        self.options, self.timeout = options, timeout
        self.slots = slots or [({}, options.device_index)]  # (environment, device index) per worker, in turn
        self.started = 0
        self.crashed = 0
        self.failed_starts = 0
        self.workers = [self._start(i) for i in range(size)]
        self.waiting: list[tuple[Any, ...]] = []  # (key, dump.json, entry, options, tensors) not taken yet

    def _start(self, slot: int) -> _Worker:
        ours, theirs = self.context.Pipe()
        env, index = self.slots[slot % len(self.slots)]
        options = dataclasses.replace(self.options, device_index=index)
        process = self.context.Process(target=serve, args=(theirs, options, env), daemon=True,
                                       name=f"msprobe-online-worker-{self.started}")
        with _main_unnamed():
            process.start()
        theirs.close()
        self.started += 1
        return _Worker(process, ours, self.started - 1)

    @property
    def busy(self) -> int:
        return sum(w.task is not None for w in self.workers) + len(self.waiting)

    def submit(self, key: Any, dump_json: Path, entry_name: str, options: Any = None,
               held: dict[str, Any] | None = None) -> None:
        """Queue a call; it goes to the first worker that is ready. `options`: this call's own, else the pool's
        (the in-process check learns the recording device from the first call, after its workers started);
        `held`: its tensors by data_name, sent through shared memory instead of read from files."""
        self.waiting.append((key, str(dump_json), entry_name, options, held))
        self._dispatch()

    def _dispatch(self) -> None:
        for worker in self.workers:
            if not self.waiting:
                return
            if worker.ready and worker.task is None:
                key, *task = self.waiting.pop(0)
                try:
                    worker.conn.send(tuple(task))
                except OSError:  # died while idle: found by results()
                    self.waiting.insert(0, (key, *task))
                    continue
                worker.task, worker.what, worker.since = key, task[1], time.monotonic()

    def results(self, timeout: float) -> list[tuple[Any, tuple[str, Any]]]:
        """Wait up to `timeout` seconds for answers; every finished call's (key, answer)."""
        out: list[tuple[Any, tuple[str, Any]]] = []
        handles: dict[Any, _Worker] = {}
        for w in self.workers:
            handles[w.conn] = w
            handles[w.process.sentinel] = w
        if self.timeout is not None:
            busy = [w.since + self.timeout for w in self.workers if w.task is not None]
            if busy:
                timeout = max(0.0, min(timeout, min(busy) - time.monotonic()))
        ready = wait(list(handles), timeout)
        for worker in dict.fromkeys(handles[h] for h in ready):
            answer = self._read(worker)
            if answer is None:
                continue
            if answer[0] == "ready":
                worker.ready = True
                continue
            out.append((worker.task, answer))
            worker.task = None
        now = time.monotonic()
        for worker in self.workers:
            if worker.task is not None and self.timeout is not None and now - worker.since > self.timeout:
                out.append((worker.task, ("crashed", f"timed out after {self.timeout:g} s (msprobe_timeout): "
                                                     f"the worker was stopped while running {worker.what}")))
                worker.task = None
                self._replace(worker, kill=True)
        self._dispatch()
        return out

    def _read(self, worker: _Worker) -> tuple[str, Any] | None:
        """The worker's answer, or None (and a crash answer for its call, if any) when it died."""
        try:
            if worker.conn.poll():
                answer: tuple[str, Any] = worker.conn.recv()
                return answer
        except (EOFError, OSError):
            pass
        if worker.process.is_alive():
            return None
        worker.process.join(1)
        code = worker.process.exitcode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 and \
            -code in signal.Signals._value2member_map_ else f"exit code {code}"
        what = worker.what if worker.task is not None else "nothing"
        self.crashed += 1
        if not worker.ready:
            self.failed_starts += 1
            if self.failed_starts >= 3:
                raise WorkersFailed(f"the online workers die as they start ({how}); -o msprobe_online_workers=1 "
                                    "checks in the session's own process")
        self._replace(worker, kill=False)
        if worker.task is None:
            return None
        message = (f"worker crashed while running {what} (online worker {worker.number} died: {how}); a fresh "
                   "worker goes on")
        return ("crashed", message)

    def _replace(self, worker: _Worker, kill: bool) -> None:
        if kill and worker.process.is_alive():
            worker.process.kill()
            worker.process.join(5)
        worker.conn.close()
        fresh = self._start(self.workers.index(worker))
        self.workers[self.workers.index(worker)] = fresh

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.conn.send(STOP)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for worker in self.workers:
            worker.process.join(max(0.1, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(1)
            worker.conn.close()
