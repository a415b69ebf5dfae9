"""Reviewed known failures (`--msprobe-baseline FILE`) as strict xfails, and writing such a file.

Strict, so the gate ratchets: a listed API that starts passing is an XPASS(strict) failure until
its line is removed; the item's failure text and the msprobe summary name the lines to remove. The
file is a YAML (or JSON) list of {api: pattern, reason: text}; a pattern is an fnmatch pattern tried
on the node id, the entry name (`Functional.linear.0.forward`) and the call name (`Functional.linear.0`),
so one line covers that call in every rank's dump.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from ..records.record import Record

HEADER = ("# pytest-msprobe baseline: reviewed known failures, run as xfail(strict=True).\n"
          "# Replace each reason with the review outcome (ticket, owner); delete a line when its API is fixed.\n")
XPASS = "[XPASS(strict)]"  # pytest's prefix of a strict xfail that passed


class Entry(NamedTuple):
    api: str
    reason: str
    first_line: int  # the lines of the file the entry takes (1-based, inclusive): what to delete
    last_line: int

    def lines(self) -> str:
        return f"line {self.first_line}" if self.first_line == self.last_line else \
            f"lines {self.first_line}-{self.last_line}"


def load(path: Path) -> list[Entry]:
    """The file's entries with their lines; a malformed file is a usage error naming the entry."""
    import yaml  # only with --msprobe-baseline: not in every process the plugin loads in (15-20 ms)

    try:
        text = path.read_text(encoding="utf-8")
        loader = yaml.SafeLoader(text)  # JSON is YAML too
        try:
            node = loader.get_single_node()
            entries = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except (OSError, yaml.YAMLError) as exc:
        raise pytest.UsageError(f"--msprobe-baseline {path}: {exc}") from None
    if isinstance(entries, Mapping) and "baseline" in entries:
        entries = entries["baseline"]
        node = next(v for k, v in node.value if k.value == "baseline")
    if not isinstance(entries, list):
        raise pytest.UsageError(f"--msprobe-baseline {path}: expected a list of {{api, reason}} entries")
    result = []
    lines = text.splitlines()
    for i, (entry, entry_node) in enumerate(zip(entries, node.value)):
        if not (isinstance(entry, Mapping) and isinstance(entry.get("api"), str) and entry["api"]
                and isinstance(entry.get("reason"), str) and entry["reason"].strip()):
            raise pytest.UsageError(f"--msprobe-baseline {path}: entry {i} needs a non-empty 'api' and 'reason'")
        result.append(Entry(entry["api"], entry["reason"].strip(), *_lines(entry_node, lines)))
    return result


def _lines(node: Any, lines: list[str]) -> tuple[int, int]:
    """(first, last) 1-based line of a node: from its start to the end of its last value, less the blank lines
    a block scalar takes in (not the comments or blank lines before the next entry)."""
    first = node.start_mark.line
    end = (node.value[-1][1] if node.value and isinstance(node.value, list) else node).end_mark
    last = end.line - 1 if end.column == 0 else end.line
    while last > first and not lines[last].strip():
        last -= 1
    return first + 1, max(first, last) + 1


def first_match(patterns: Sequence[str], nodeid: str) -> int | None:
    """The index of the first pattern matching the node id, entry name or call name."""
    entry_name = nodeid.rpartition("::")[2]
    names = (nodeid, entry_name, entry_name.rsplit(".", 1)[0])
    for i, pattern in enumerate(patterns):
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            return i
    return None


def match(entries: Sequence[Entry], nodeid: str) -> Entry | None:
    i = first_match([e.api for e in entries], nodeid)
    return None if i is None else entries[i]


def _s(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _count(n: int, word: str, plural: str = "") -> str:
    return f"{n} {_s(n, word, plural or word + 's')}"


class Baseline:
    """Marks the listed items strict xfails; on the controller, counts per entry the items that still fail and
    those that pass now, for the summary's lines to remove."""

    def __init__(self, entries: list[Entry], shown: str) -> None:
        self.entries, self.shown = entries, shown  # shown: the file as the command line named it
        self.failing: dict[int, int] = {}  # entry index -> its items that still fail (xfailed)
        self.passing: dict[int, list[str]] = {}  # entry index -> node ids of its items that pass (XPASS(strict))

    def strict_xfail(self, nodeid: str) -> tuple[str, str] | None:
        """(xfail reason, failure text once it passes) of the item, if the baseline lists it."""
        entry = match(self.entries, nodeid)
        if entry is None:
            return None
        from ..reports.summary import shorten

        return f"msprobe baseline: {entry.reason}", (
            f"{XPASS} msprobe baseline: passes now; remove {entry.lines()} of {self.shown} "
            f"({entry.api}: {shorten(' '.join(entry.reason.split()), 80)})")

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            xfail = self.strict_xfail(item.nodeid)
            if xfail is not None:
                item.add_marker(pytest.mark.xfail(strict=True, reason=xfail[0]))

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest's own (skipping.py), which writes the text
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
            None, pytest.TestReport, pytest.TestReport]:
        """pytest's text for a strict xfail that passed repeats the reason; say instead which lines to remove."""
        report = yield
        if report.failed and isinstance(report.longrepr, str) and report.longrepr.startswith(XPASS):
            xfail = self.strict_xfail(item.nodeid)
            if xfail is not None:
                report.longrepr = xfail[1]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        i = first_match([e.api for e in self.entries], report.nodeid)
        if i is None:
            return
        if report.skipped and hasattr(report, "wasxfail"):
            self.failing[i] = self.failing.get(i, 0) + 1
        elif report.failed and isinstance(report.longrepr, str) and report.longrepr.startswith(XPASS):
            self.passing.setdefault(i, []).append(report.nodeid)

    @pytest.hookimpl(trylast=True)  # after the msprobe section's counts (plugin.ResultCollector)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        lines = self.passing_lines(len(terminalreporter.stats.get("failed", ())))
        if not lines:
            return
        results = config.pluginmanager.get_plugin("msprobe-results")
        if not getattr(results, "written", None):  # no msprobe section above to add to
            terminalreporter.section("msprobe")
        terminalreporter.write_line(lines[0], red=True, bold=True)
        for line in lines[1:]:
            terminalreporter.write_line(line)

    def passing_lines(self, failed: int) -> list[str]:
        """What the summary says of listed items that pass now: how msprobe's counts and pytest's read together,
        the entries to remove, and those to narrow (they still match items that fail)."""
        if not self.passing:
            return []
        items = sum(len(ids) for ids in self.passing.values())
        fixed = [i for i in sorted(self.passing) if not self.failing.get(i)]
        partly = [i for i in sorted(self.passing) if self.failing.get(i)]
        lines = [f"baseline: {_count(items, 'item')} listed in {self.shown} now {_s(items, 'passes', 'pass')}: "
                 f"counted as pass above, and as failed by pytest (XPASS(strict): {items} of pytest's {failed} "
                 f"failed) until {_s(len(self.passing), 'its entry is', 'their entries are')} removed"]
        if fixed:
            lines.append(f"baseline: {_count(len(fixed), 'entry', 'entries')} now {_s(len(fixed), 'passes', 'pass')}; "
                         f"remove {_s(len(fixed), 'it', 'them')} from {self.shown}:")
            lines += [f"  {self.entries[i].lines()} ({self.entries[i].api}): {_count(len(self.passing[i]), 'item')} "
                      f"{_s(len(self.passing[i]), 'passes', 'pass')}" for i in fixed]
        if partly:
            lines.append(f"baseline: {_count(len(partly), 'entry', 'entries')} also "
                         f"{_s(len(partly), 'matches', 'match')} items that still fail; narrow "
                         f"{_s(len(partly), 'it', 'them')} in {self.shown} to those:")
            lines += [f"  {self.entries[i].lines()} ({self.entries[i].api}): {len(self.passing[i])} of "
                      f"{len(self.passing[i]) + self.failing[i]} items pass, e.g. {self.passing[i][0]}"
                      for i in partly]
        return lines


def strict_xfail(config: pytest.Config, nodeid: str) -> tuple[str, str] | None:
    """(xfail reason, failure text once it passes) the baseline gives this item, if any (also for results taken
    from the journal)."""
    plugin = config.pluginmanager.get_plugin("msprobe-baseline")
    return plugin.strict_xfail(nodeid) if plugin is not None else None


def _bad(warning_as_error: bool) -> set[str]:
    """The statuses that fail the gate."""
    return {"error", "Warning"} if warning_as_error else {"error"}


def _name(rec: Record) -> str:
    return f"{rec.api}.{rec.direction}"


def failures(records: Iterable[Record], warning_as_error: bool = False) -> list[dict[str, str]]:
    """Baseline entries for the failing items of a run, in record order: one per entry name when it fails
    in every dump that has it, else one per failing dump (`*rank1/dump.json::<entry>`), so the entry's
    passing calls in the other dumps do not become XPASS(strict) failures."""
    from ..reports.results import dump_tails
    from ..reports.summary import reason, shorten

    records, bad = list(records), _bad(warning_as_error)
    tails = dump_tails([rec.dump or "" for rec in records])
    passing = {_name(rec) for rec in records if rec.status not in bad}
    seen: dict[str, dict[str, str]] = {}
    for rec in records:
        if rec.status in bad:
            name = _name(rec)
            tail = tails.get(rec.dump or "")
            pattern = f"*{tail}::{name}" if name in passing and tail else name
            seen.setdefault(pattern, {"api": pattern, "reason": f"TODO review: {shorten(reason(rec), 400)}"})
    return list(seen.values())


def written_line(entries: Sequence[Mapping[str, str]], records: Iterable[Record], output: str,
                 warning_as_error: bool = False) -> str:
    """What writing the baseline says: N failing items as M entries, and why M is smaller (a call failing in
    several dumps is one entry, which matches it in each)."""
    bad = _bad(warning_as_error)
    failing = [rec for rec in records if rec.status in bad]
    if not failing:
        return f"no failing items: wrote an empty baseline to {output}"
    patterns = [e["api"] for e in entries]
    per_entry: dict[int | None, int] = {}
    for rec in failing:
        i = first_match(patterns, rec.nodeid or _name(rec))
        per_entry[i] = per_entry.get(i, 0) + 1
    dumps = len({rec.dump or "" for rec in failing})
    line = f"{_count(len(failing), 'failing item')}{f' from {dumps} dumps' if dumps > 1 else ''} as " \
           f"{_count(len(entries), 'entry', 'entries')} written to {output}"
    shared = sum(1 for i, n in per_entry.items() if i is not None and n > 1)
    if shared:
        calls = "one call fails" if shared == 1 else f"{shared} calls fail"
        line += (f": {calls} in {'both dumps' if dumps == 2 else 'several dumps'}, one entry per call (an entry "
                 f"that names the call matches it in every dump)")
    return line


def dump_yaml(entries: list[dict[str, str]]) -> str:
    import yaml

    return HEADER + (yaml.safe_dump(entries, allow_unicode=True, sort_keys=False, width=120) if entries else "[]\n")


def configure(config: pytest.Config) -> None:
    path = config.getoption("msprobe_baseline") or config.getini("msprobe_baseline")
    if path:
        entries = load(config.invocation_params.dir / path)
        config.pluginmanager.register(Baseline(entries, str(path)), "msprobe-baseline")
