"""ini `msprobe_keep_runs N` (session/ini_keys.py): its check, and the controller's pruning of older result
sets after the run's files are written (reports/result_sets.py does the file work)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ..reports.result_sets import keep_newest, summary_line
from . import ini_keys


def keep_runs(config: pytest.Config) -> int:
    """The number of result sets to keep; a usage error for anything but an integer >= 0."""
    value = ini_keys.value(config, "msprobe_keep_runs") or ""
    where = ini_keys.where(config, "msprobe_keep_runs")
    try:
        keep = int(value)
    except ValueError:
        raise pytest.UsageError(f"{where} wants a number of result sets >= 0, got {value!r}") from None
    if keep < 0:
        raise pytest.UsageError(f"{where} wants a number of result sets >= 0, got {keep}")
    return keep


def prune(out_dir: Path, keep: int) -> str:
    """Keep the newest `keep` result sets in out_dir; the summary line that says what was kept and removed."""
    kept, removed = keep_newest(out_dir, keep)
    return summary_line(out_dir, keep, kept, removed)
