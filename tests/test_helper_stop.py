"""helper.stop (Ctrl-C): the calls queued for the helper thread are cancelled, the running one ends at its next
Python step, and the thread goes on with the calls submitted afterwards (a later session in the same process)."""
from __future__ import annotations

import threading
import time

import pytest

from pytest_msprobe.helper import Stopped, helper, stop


def test_stop_cancels_the_queue_and_ends_the_running_call_at_its_next_step() -> None:
    running = threading.Event()

    def long_call() -> str:
        running.set()
        for _ in range(3000):  # 30 s in steps of 10 ms
            time.sleep(0.01)
        return "finished"

    first = helper().submit(long_call)
    queued = helper().submit(lambda: "ran")
    assert running.wait(30)
    began = time.monotonic()
    stop()
    with pytest.raises(Stopped):
        first.result(timeout=20)
    assert time.monotonic() - began < 10
    assert queued.cancelled()
    assert helper().submit(lambda: 42).result(timeout=20) == 42


def test_a_stop_between_calls_reaches_no_later_call() -> None:
    assert helper().submit(lambda: 1).result(timeout=20) == 1
    stop()  # nothing runs: nothing to end
    done = helper().submit(lambda: sum(range(100_000)))
    assert done.result(timeout=20) == sum(range(100_000))
