"""The one thread a check may use beside its own, when the process has a spare core
(CheckOptions.work_threads > 1): it makes the bench's side and runs the bench (forward and backward) while the
item's thread runs the device and the third run (check.rerun), draws chunks of a large random tensor beside the
item's thread (inputs.build), builds the next item's inputs (check.prepare.prefetch) and computes a large
output's msprobe metrics while the item's thread runs the strict checks (check.compare.start_metrics), or those
checks while the item's thread computes the metrics. One thread for every stage, so a process keeps at most two busy.

A long compiled pass may be cut into grains that either thread takes (`share`): the item's thread joins the
helper's pass while it waits for its result (`wait_helping`), and the helper joins the item's thread's pass when
it is free. A pass's result must not depend on which thread took which grain.

Ctrl-C (`stop`, from the plugin's pytest_keyboard_interrupt) drops the calls queued and ends the one running at its
next Python step (the torch or compiled call running then still ends: it cannot be cut), so an interrupted run
neither waits at exit for a bench or the next item's inputs that nobody will read, nor runs them while pytest
reports. The thread is a daemon that is stopped and joined at exit (atexit), never left running torch while the
interpreter finalizes."""
from __future__ import annotations

import atexit
import ctypes
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

_T = TypeVar("_T")
_NAME = "msprobe-helper"  # the helper thread's name prefix: how share() knows it runs there


class Stopped(BaseException):
    """Raised in the helper thread, in the call it runs, by `stop`: nobody waits for that call's result any more."""


class Helper:
    """One thread that runs the calls submitted to it in order, as a one-thread ThreadPoolExecutor does, and that
    can be stopped."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[int, Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._thread_id: ctypes.c_ulong | None = None
        self._epoch = 0  # calls submitted before the latest stop() belong to an earlier one: they do not run
        self._running = False  # a call runs: stop() may raise Stopped in it, once (_raised)
        self._raised = False

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"{_NAME}_0", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            self._jobs.put((self._epoch, future, functools.partial(fn, *args, **kwargs)))
        return future

    def stop(self) -> None:
        """Cancel the calls queued; the running one raises Stopped at its next Python step."""
        with self._lock:
            self._epoch += 1
            if self._running and not self._raised and self._thread_id is not None and _ASYNC_EXC is not None:
                _ASYNC_EXC(self._thread_id, ctypes.py_object(Stopped))
                self._raised = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job[1].cancel()

    def close(self) -> None:
        """At exit: stop, and wait for the call running now to reach its next Python step."""
        self.stop()
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join()

    def _work(self) -> None:
        self._thread_id = ctypes.c_ulong(threading.get_ident())
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._run(*job)
            del job  # the call's arguments go now, not when the next call comes

    def _run(self, epoch: int, future: Future[Any], call: Callable[[], Any]) -> None:
        with self._lock:
            if epoch != self._epoch:
                future.cancel()
                return
            if not future.set_running_or_notify_cancel():
                return
            self._running, self._raised = True, False
        result, error = None, None
        try:
            try:
                result = call()
            except BaseException as exc:  # Stopped too: the future says so, if anyone still asks
                error = exc
            self._done()
        except Stopped as exc:  # it arrived just after the call returned
            error = exc
            self._done()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _done(self) -> None:
        """The call is over: no Stopped is raised for it any more (one set but not raised yet is dropped)."""
        with self._lock:
            self._running = False
            if self._raised and _ASYNC_EXC is not None:
                _ASYNC_EXC(self._thread_id, None)


# CPython's way to raise an exception in another thread at its next Python step (None: not there)
_ASYNC_EXC = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)


@functools.cache
def helper() -> Helper:
    return Helper()


def stop() -> None:
    """Ctrl-C: the helper's calls are no longer wanted (nothing when it never started)."""
    if helper.cache_info().currsize:
        helper().stop()


class _Shared:
    """One pass's grains, taken in order by whichever thread asks next."""

    def __init__(self, count: int, grain: int, work: Callable[[int, int], None]) -> None:
        self.todo = iter(range(0, count, grain))
        self.count, self.grain, self.work = count, grain, work
        self.busy = 0  # grains being worked on
        self.left = True  # grains not taken yet
        self.error: BaseException | None = None
        self.done = threading.Condition()

    def run(self) -> None:
        """Work grains until none is left. A failure stops the pass and reaches its owner (`finish`)."""
        while True:
            with self.done:
                start = next(self.todo, None) if self.error is None else None
                if start is None:
                    self.left = False
                    return
                self.busy += 1
            try:
                self.work(start, min(self.count, start + self.grain))
            except BaseException as error:  # a timeout in the item's thread too: the owner must not use the pass
                self.error = self.error or error
                raise
            finally:
                with self.done:
                    self.busy -= 1
                    self.done.notify_all()

    def finish(self) -> None:
        """Wait for the grains other threads took; raise the first failure."""
        with self.done:
            while self.busy:
                self.done.wait()
        if self.error is not None:
            raise self.error


_posted: list[_Shared] = []  # the helper thread's passes now running, for a waiting thread to join
_board = threading.Condition()


def share(count: int, grain: int, work: Callable[[int, int], None], *, join: bool = False) -> None:
    """work(start, stop) over [0, count) in grains of `grain`. In the helper thread, a thread waiting for it
    (wait_helping) takes grains too; elsewhere with `join`, the helper thread takes grains when it is free (its
    turn is cancelled if it has not started by the end). One call when neither may happen."""
    on_helper = threading.current_thread().name.startswith(_NAME)
    if count <= grain or not (on_helper or join):
        work(0, count)
        return
    shared = _Shared(count, grain, work)
    if on_helper:
        with _board:
            _posted.append(shared)
            _board.notify_all()
        try:
            shared.run()
        finally:
            with _board:
                _posted.remove(shared)
        shared.finish()
        return
    joined = helper().submit(shared.run)
    shared.run()
    joined.cancel()  # not started: nothing left for it; else finish waits for its grain
    shared.finish()


def wait_helping(future: Future[_T]) -> _T:
    """future.result(), working the grains of the helper thread's shared passes while waiting for it."""
    def wake(_: Any) -> None:
        with _board:
            _board.notify_all()

    future.add_done_callback(wake)
    while True:
        with _board:
            while not future.done() and not any(s.left for s in _posted):
                _board.wait()
            shared = next((s for s in _posted if s.left), None)
        if shared is None:
            return future.result()
        try:
            shared.run()
        except Exception:  # the pass's owner raises it (_Shared.finish), where its result is used
            pass
