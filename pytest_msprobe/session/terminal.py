"""The run's lines in the terminal: the report header and the terminal summary (counts, devices, the
worst failures, the files written). Record-only wording lives in reports/summary.py."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from ..records.record import Record
from ..reports.summary import file_lines, skip_lines, worst


def header_lines(config: pytest.Config) -> list[str]:
    from .devices import DEVICES_KEY
    from .journal import JOURNAL_KEY

    lines = []
    if DEVICES_KEY in config.stash:
        lines.append(config.stash[DEVICES_KEY].header())
    journal = config.stash.get(JOURNAL_KEY, None)
    if journal is not None and journal.resume:
        lines.append(f"msprobe: resuming from {journal.path}: {len(journal.finished)} finished item(s) there")
    from .workers import header_line

    workers_line = header_line(config)
    if workers_line:
        lines.append(workers_line)
    if config.getoption("msprobe_shard"):
        lines.append("msprobe: shard {}/{} of every dump".format(*config.getoption("msprobe_shard")))
    return lines


def terminal_lines(config: pytest.Config, records: list[Record], written: Mapping[str, Any],
                   resumed: int, known: int, fuzz_counts: Mapping[str, int] | None = None) -> list[str]:
    """Counts by status, where results came from, devices, the worst failures, the files."""
    from ..reports.results import reference_only, summary_counts
    from .devices import DEVICES_KEY
    from .guard import CRASH_KEY
    from .journal import JOURNAL_KEY
    from .stash import SETTINGS_KEY

    ref_only = reference_only(records)
    counts = summary_counts(r for r in records if not r.reference_only)
    standard = config.stash[SETTINGS_KEY].standard
    lines = [f"items ({standard} verdicts): " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))]
    if fuzz_counts:  # <entry>[fuzz] items (--msprobe-fuzz) have no row in msprobe's files
        lines[0] += "; [fuzz] items: " + ", ".join(f"{fuzz_counts[k]} {k}" for k in sorted(fuzz_counts))
    lines += layer1_lines(records)
    if ref_only:
        lines.append(f"{sum(ref_only.values())} items checked only the reference (" + ", ".join(
            f"{v} {k}" for k, v in sorted(ref_only.items())) + "): NPU ops without an NPU run their bench function "
            "on both sides, so they test the inputs and the bench, not a vendor kernel")
    notes = []
    if resumed:
        notes.append(f"{resumed} taken from the journal (--msprobe-resume)")
    if known:
        notes.append(f"{known} known failure(s) xfailed by the baseline")
    reused = sum(1 for r in records if r.reused_from)
    if reused:
        notes.append(f"{reused} reused the result of an identical call (msprobe_filter_api)")
    crash = config.stash.get(CRASH_KEY, None)
    if crash is not None and crash.crashed:
        notes.append(f"{crash.crashed} crashed or hung item(s)")
    if notes:
        lines.append("; ".join(notes))
    lines += skip_lines(records)
    info = config.stash.get(DEVICES_KEY, None)
    if info is not None:
        ran_on = sorted({r.device for r in records if r.device})
        where = info.hooks.summary() if info.hooks is not None else str(info.slot)
        lines.append(f"devices: {where}; items ran on {', '.join(ran_on) or '-'}")
    bad = worst(records)
    if bad:
        lines.append(f"worst failures ({len(bad)} of {counts.get('error', 0) + ref_only.get('error', 0)}):")
        lines += [f"  {line}" for line in bad]
    lines.append(f"run seed: {config.stash[SETTINGS_KEY].check_options.run_seed} (--msprobe-seed)")
    lines += file_lines(written)
    journal = config.stash.get(JOURNAL_KEY, None)
    if journal is not None:
        lines.append(f"journal: {journal.path}")
    return lines


def layer1_lines(records: list[Record]) -> list[str]:
    """The Status counts of the details CSVs, labelled apart from the items' verdicts above: the CSVs hold
    run_ut's own (Layer-1, original standard) verdict of each output, which the selected standard may overrule."""
    from ..reports.results import STATUSES, details_statuses
    from ..verdict.ms_results import is_mindspore

    rows = details_statuses(records)
    if not rows:
        return []
    rows = {**dict.fromkeys(STATUSES, 0), **rows}  # the items' shape: the four statuses, zeros too
    which = "PyTorch dumps' details CSV rows" if any(is_mindspore(r) for r in records) else "details CSV rows"
    return [f"{which} (msprobe's Layer-1 Status, original standard; one per output): "
            + ", ".join(f"{rows[k]} {k}" for k in sorted(rows))]


SLOW_WARM_UP_S = 3.0  # a warm-up from numba's cache takes 0.4-1 s; compiling, 30-60 s on two cores
SLOW_FIRST_RESULT_S = 20.0  # xdist: a worker starts and loads the checks in 2-3 s with numba's cache warm
SLOW_LOAD_S = 30.0  # numba's cache is there: only a busy machine (or a cache numba must redo) takes this long
COMPILING = ("msprobe: compiling the checks for this machine, once (up to a minute or two); numba caches them "
             "for later runs (NUMBA_CACHE_DIR, else __pycache__ beside the package)")
WORKERS_COMPILING = ("msprobe: no result yet; on a machine's first run each worker compiles the checks, once (up to "
                     "a minute or two), and numba caches them for later runs")
LOADING = ("msprobe: loading the compiled checks from numba's cache is taking long (a busy machine, or a cache "
           "of another numba version or CPU, which numba compiles again)")


def warm_up_notice(workers: bool) -> tuple[str, float]:
    """(what to say, after how many seconds of silence) while the first item, or xdist's first result, waits for
    the compiled checks: "compiling" only when numba's cache does not hold them yet."""
    from .numba_cache import checks_cached

    if checks_cached():
        return LOADING, SLOW_LOAD_S
    return (WORKERS_COMPILING, SLOW_FIRST_RESULT_S) if workers else (COMPILING, SLOW_WARM_UP_S)


class Notice:
    """`text` said in the terminal once `after` seconds have passed, unless cancelled before: for a wait the run
    would otherwise pass in silence. Nothing in an xdist worker, whose terminal nobody sees."""

    def __init__(self, config: pytest.Config, text: str, after: float) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        self.timer = None if reporter is None or hasattr(config, "workerinput") else \
            threading.Timer(after, lambda: reporter.write_line(text, yellow=True))
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


@contextlib.contextmanager
def notice_if_slow(config: pytest.Config, text: str, after: float) -> Iterator[None]:
    """Say `text` if the block is still running `after` seconds on: the first item's warm-up compiles the checks
    on a machine whose numba cache is cold, and the run printed nothing for that long."""
    notice = Notice(config, text, after)
    try:
        yield
    finally:
        notice.cancel()
