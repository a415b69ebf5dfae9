"""Check a training step in its own process as it runs: every API call of a block is captured with its real
inputs and outputs and checked by the one protocol in replay mode (the device's result is the output the
step produced), in worker processes beside the step.

    with pytest_msprobe.checking(out="msprobe_out", sample=10, workers=2) as checker:
        for batch in loader:
            train_step(batch)
            checker.step()

online/capture.py sees the calls, checker.py numbers, samples and copies them, queue.py bounds what is held,
feeder.py spools them to the workers and collects the records, outputs.py writes the files and the summary,
dispatch.py is msprobe's `PtdbgDispatch` on top of them. Pytest-free.
"""
from __future__ import annotations

from typing import Any


def checking(**options: Any) -> Any:
    """A `Checking` (checker.py) for `checker.Options(**options)`. Imported lazily: importing the package
    imports no torch."""
    from .checker import Checking, Options

    return Checking(Options(**options))


__all__ = ["checking"]
