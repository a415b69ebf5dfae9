"""pytest-msprobe: every API call of an msprobe dump.json becomes a pytest item.

The tree is the pipeline; a subpackage imports only those before it (tests/test_layout.py holds the order):

    dump/ -> specs/ -> inputs/ -> runs/ -> metrics/ -> verdict/   the stages of one call's check
    check/    one entry through those stages into its record (check.check_entry)
    reports/  records -> msprobe's CSVs, JSON lines, terminal lines
    triage/   from a red record to a fix: error data, repro scripts, the HTML page
    online/   calls streamed from a running training job into the same check
    inprocess/ a training step's own calls checked as it runs (`pytest_msprobe.checking`)
    session/  the pytest layer (plugin.py registers it); nothing before it imports pytest
    records/  below them all: the record's vocabulary (columns, file headers, the form records travel in)

Importing the package imports nothing else: the plugin loads torch and numba on the first item.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def checking(**options: Any) -> Any:
    """`with pytest_msprobe.checking(out=..., sample=..., workers=...): train_step()`: check each API call of
    the block as it runs (inprocess/). Imported on the first call: importing the package imports no torch."""
    from .inprocess import checking as start

    return start(**options)


def PtdbgDispatch(*args: Any, **kwargs: Any) -> Any:  # noqa: N802  # msprobe's spelling
    """msprobe's online_dispatch entry point, with its arguments (inprocess/dispatch.py)."""
    from .inprocess.dispatch import PtdbgDispatch as dispatch

    return dispatch(*args, **kwargs)
