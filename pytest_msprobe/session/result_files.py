"""`--msprobe-keep-runs N` / ini `msprobe_keep_runs`: the option, its check, and the controller's pruning of
older result sets after the run's files are written (reports/result_sets.py does the file work)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..reports.result_sets import DEFAULT_KEEP, keep_newest, summary_line


def addoption(group: Any, parser: pytest.Parser) -> None:
    group.addoption("--msprobe-keep-runs", default=None, metavar="N",
                    help=f"keep the newest N sets of result files in --msprobe-out, remove older ones (default "
                         f"{DEFAULT_KEEP}; 0: keep every set)")
    parser.addini("msprobe_keep_runs", "default for --msprobe-keep-runs", default=str(DEFAULT_KEEP))


def keep_runs(config: pytest.Config) -> int:
    """The number of result sets to keep; a usage error for anything but an integer >= 0."""
    option = config.getoption("msprobe_keep_runs")
    value = option if option is not None else config.getini("msprobe_keep_runs")
    where = "--msprobe-keep-runs" if option is not None else "ini msprobe_keep_runs"
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
