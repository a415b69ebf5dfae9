"""The bound on what the training process holds for the check: bytes of captured tensors not yet checked.

A call reserves its bytes before its tensors are copied (its size is known from their shapes), and gives them
back when its record returns. So the copies the step has made and the checks have not finished stay within
`limit`, on the host and in the spool alike. When the bound is reached the step either waits for room or the
call is counted as not checked (`wait=False`); a call larger than the whole bound waits until nothing else is
held, so it is never refused for its size alone when the step may wait.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any


class Budget:
    """Bytes held against a limit, shared by the capturing thread and the feeder."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"queue_bytes={limit}: must be positive")
        self.limit, self.held, self.peak = limit, 0, 0
        self._cond = threading.Condition()

    def reserve(self, nbytes: int, wait: bool) -> bool:
        """Hold `nbytes`, waiting for room when `wait`; False when there is none and the call may not wait."""
        with self._cond:
            while self.held and self.held + nbytes > self.limit:
                if not wait:
                    return False
                self._cond.wait()
            self.held += nbytes
            self.peak = max(self.peak, self.held)
            return True

    def release(self, nbytes: int) -> None:
        with self._cond:
            self.held = max(0, self.held - nbytes)
            self._cond.notify_all()


class Calls:
    """The captured calls on their way to the feeder, in capture order; `close` ends `get`'s wait."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._cond = threading.Condition()
        self.closed = False

    def put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def get(self, timeout: float) -> Any:
        """The next call, or None after `timeout` seconds (or at once when closed and empty)."""
        with self._cond:
            if not self._items and not self.closed:
                self._cond.wait(timeout)
            return self._items.popleft() if self._items else None

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
