"""The one thread a check may use beside its own, when the process has a spare core
(CheckOptions.work_threads > 1): it makes the bench's side and runs the bench (forward and backward) while the
item's thread runs the device and the third run (check.rerun), draws chunks of a large random tensor beside the
item's thread (inputs.build), builds the next item's inputs (check.prepare.prefetch) and computes a large
output's msprobe metrics while the item's thread runs the strict checks (check.compare.start_metrics), or those
checks while the item's thread computes the metrics. One thread for every stage, so a process keeps at most two busy.

A long compiled pass may be cut into grains that either thread takes (`share`): the item's thread joins the
helper's pass while it waits for its result (`wait_helping`), and the helper joins the item's thread's pass when
it is free. A pass's result must not depend on which thread took which grain."""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")
_NAME = "msprobe-helper"  # the helper thread's name prefix: how share() knows it runs there


@functools.cache
def helper() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=_NAME)


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
