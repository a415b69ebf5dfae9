"""Reviewed known failures (`--msprobe-baseline FILE`) as strict xfails, and writing such a file.

Strict, so the gate ratchets: a listed API that starts passing is an XPASS(strict) failure until
its line is removed. The file is a YAML (or JSON) list of {api: pattern, reason: text}; a pattern
is an fnmatch pattern tried on the node id, the entry name (`Functional.linear.0.forward`) and the
call name (`Functional.linear.0`), so one line covers that call in every rank's dump.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

HEADER = ("# pytest-msprobe baseline: reviewed known failures, run as xfail(strict=True).\n"
          "# Replace each reason with the review outcome (ticket, owner); delete a line when its API is fixed.\n")


def load(path: Path) -> list[tuple[str, str]]:
    """[(pattern, reason)]; a malformed file is a usage error naming the entry."""
    import yaml  # only with --msprobe-baseline: not in every process the plugin loads in (15-20 ms)

    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML too
    except (OSError, yaml.YAMLError) as exc:
        raise pytest.UsageError(f"--msprobe-baseline {path}: {exc}") from None
    if isinstance(entries, Mapping) and "baseline" in entries:
        entries = entries["baseline"]
    if not isinstance(entries, list):
        raise pytest.UsageError(f"--msprobe-baseline {path}: expected a list of {{api, reason}} entries")
    result = []
    for i, entry in enumerate(entries):
        if not (isinstance(entry, Mapping) and isinstance(entry.get("api"), str) and entry["api"]
                and isinstance(entry.get("reason"), str) and entry["reason"].strip()):
            raise pytest.UsageError(f"--msprobe-baseline {path}: entry {i} needs a non-empty 'api' and 'reason'")
        result.append((entry["api"], entry["reason"].strip()))
    return result


def match(entries: list[tuple[str, str]], nodeid: str) -> str | None:
    """The reason of the first pattern matching the node id, entry name or call name."""
    entry_name = nodeid.rpartition("::")[2]
    names = (nodeid, entry_name, entry_name.rsplit(".", 1)[0])
    for pattern, reason in entries:
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            return reason
    return None


class Baseline:
    def __init__(self, entries: list[tuple[str, str]]) -> None:
        self.entries = entries

    def xfail_reason(self, nodeid: str) -> str | None:
        reason = match(self.entries, nodeid)
        return None if reason is None else f"msprobe baseline: {reason}"

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            reason = self.xfail_reason(item.nodeid)
            if reason is not None:
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


def xfail_reason(config: pytest.Config, nodeid: str) -> str | None:
    """The strict-xfail reason the baseline gives this item, if any (also for results taken from the journal)."""
    plugin = config.pluginmanager.get_plugin("msprobe-baseline")
    return plugin.xfail_reason(nodeid) if plugin is not None else None


def failures(records: Iterable[Mapping[str, Any]], warning_as_error: bool = False) -> list[dict[str, str]]:
    """Baseline entries for the failing items of a run, in record order: one per entry name when it fails
    in every dump that has it, else one per failing dump (`*rank1/dump.json::<entry>`), so the entry's
    passing calls in the other dumps do not become XPASS(strict) failures."""
    from ..reports.results import dump_tails
    from ..reports.summary import reason

    records = list(records)
    bad = {"error", "Warning"} if warning_as_error else {"error"}
    tails = dump_tails([str(rec.get("dump") or "") for rec in records])
    passing = {f"{rec['api']}.{rec['direction']}" for rec in records if rec.get("status") not in bad}
    seen: dict[str, dict[str, str]] = {}
    for rec in records:
        if rec.get("status") in bad:
            name = f"{rec['api']}.{rec['direction']}"
            tail = tails.get(str(rec.get("dump") or ""))
            pattern = f"*{tail}::{name}" if name in passing and tail else name
            seen.setdefault(pattern, {"api": pattern, "reason": f"TODO review: {reason(rec)[:400]}"})
    return list(seen.values())


def dump_yaml(entries: list[dict[str, str]]) -> str:
    import yaml

    return HEADER + (yaml.safe_dump(entries, allow_unicode=True, sort_keys=False, width=120) if entries else "[]\n")


def configure(config: pytest.Config) -> None:
    path = config.getoption("msprobe_baseline") or config.getini("msprobe_baseline")
    if path:
        config.pluginmanager.register(Baseline(load(config.invocation_params.dir / path)), "msprobe-baseline")
