"""One dump entry through every stage into its record: inputs, the device and bench runs, the metrics and the
verdict. `check_entry` is the function every item, fuzz example, repro script and call script runs.

Every item takes the one sequence of protocol.py:

    entries -> placement -> inputs -> precision -> runs -> compare -> record

A mode supplies only where the device's result comes from, a device source (protocol.SOURCES): torch re-running
the call (rerun.py), the outputs the dump recorded or MindSpore running the call (replay.py, recorded.py), an
overflow run (overflow.py). The runs stage picks a runs strategy: the whole check at once (execute.Runs), or a block
of rows at a time (rerun.Pieces). calls.py holds the steps every source shares.
"""
from __future__ import annotations

from .protocol import check_entry

__all__ = ["check_entry"]
