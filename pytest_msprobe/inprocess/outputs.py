"""What a checked block leaves behind, the same files as every other run: msprobe's result and details CSVs and
the JSON lines (reports/results.py), the HTML page (triage/html.py), and the kept calls as one msprobe tensor
dump per step and rank (`<out>/dump/step<s>/rank<r>/dump.json`), which `pytest <out>/dump --msprobe-mode
replay` checks again offline, with -k, --lf and the repro scripts. Then one summary line.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..records.record import Record
from ..reports.results import write_results
from ..reports.summary import worst
from ..settings import Settings
from .selection import Selection

FAILED = ("error", "Warning")


@dataclass(frozen=True)
class Sampling:
    calls: int  # every call of a selected API the block saw
    sampled_out: int  # of them, not checked by `sample`
    every: int  # sample=


@dataclass
class Summary:
    """The closing line and what it counts; `ok`: nothing failed and every sampled call was checked."""

    line: str
    ok: bool
    counts: Counter[str]
    not_checked: int
    records: list[Record]
    paths: dict[str, Path] = field(default_factory=dict)
    replay: str | None = None  # the command that checks the kept calls again


def keeper(keep: str | Sequence[str]) -> Callable[[str, Record], bool]:
    """(API, record) -> whether the call's tensors stay in the dump: `failed` ones, `all`, `none`, or the failed
    ones and every call of the listed APIs."""
    if keep == "all":
        return lambda api, record: True
    if keep == "none":
        return lambda api, record: False
    listed = Selection(None if isinstance(keep, str) else keep)
    return lambda api, record: record.status in FAILED or (not listed.every and listed.wants_api(api))


def dump_of(out: Path, step: int, rank: int) -> Path:
    return out / "dump" / f"step{step}" / f"rank{rank}" / "dump.json"


def placed(record: Record, out: Path, step: int, rank: int) -> Record:
    """The record named as the replay of its dump names its item, so CSV sets and node ids line up."""
    dump = dump_of(out, step, rank)
    record.dump = str(dump)
    record.nodeid = f"{dump}::{record.api}.{record.direction}"
    return record


def write(out: Path, records: list[Record], kept: dict[int, Path], sampling: Sampling,
          settings: Settings) -> Summary:
    """Every file of the block, then its summary."""
    out.mkdir(parents=True, exist_ok=True)
    dumps = merge_kept(out, kept)
    shutil.rmtree(out / "calls", ignore_errors=True)
    records = [*records, *pooled_records(records, settings)]
    paths = write_results(records, out)
    if records:
        from ..triage.html import write_html

        paths["html"] = write_html(out / "msprobe_report.html", records, [], settings)
    replay = None
    if dumps:
        told = settings.check_options.recorded_on
        replay = f"pytest {out / 'dump'} --msprobe-mode replay" + \
            (f" -o msprobe_recorded_on={told}" if told not in ("auto", "cpu") else "") + \
            (f" --msprobe-standard {settings.standard}" if settings.standard != "strict" else "")
    return summarise(records, sampling, out, paths, replay)


def pooled_records(records: list[Record], settings: Settings) -> list[Record]:
    """The block's calls of one API that each passed alone and fail together (verdict/pooled.py), as records."""
    from ..specs.loader import load_specs
    from ..verdict import pooled

    specs = load_specs(user_file=settings.check_options.specs_file)
    return pooled.failed_records(records, specs, settings.standard)


def merge_kept(out: Path, kept: dict[int, Path]) -> list[Path]:
    """The kept one-call dumps (in capture order) as one tensor dump per step and rank; their tensor files are
    moved, not copied."""
    docs: dict[Path, dict[str, Any]] = {}
    for sequence in sorted(kept):
        folder = kept[sequence]
        one = json.loads((folder / "dump.json").read_text(encoding="utf-8"))
        where = one.get("online", {})
        target = dump_of(out, int(where.get("step", 0)), int(where.get("rank", 0)))
        tensors = target.parent / "dump_tensor_data"
        tensors.mkdir(parents=True, exist_ok=True)
        for path in (folder / "dump_tensor_data").glob("*.pt") if (folder / "dump_tensor_data").is_dir() else []:
            os.replace(path, tensors / path.name)
        doc = docs.setdefault(target, {"task": "tensor", "level": "L1", "framework": "pytorch",
                                       "dump_data_dir": str(tensors.resolve()), "data": {}})
        doc["data"].update(one["data"])
    for target, doc in docs.items():
        target.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return list(docs)


def summarise(records: list[Record], sampling: Sampling, out: Path, paths: dict[str, Path],
              replay: str | None) -> Summary:
    counts = Counter(r.status for r in records if not r.not_checked)
    unchecked = sum(1 for r in records if r.not_checked)
    sampled = f" (1 in {sampling.every} per API)" if sampling.every > 1 else ""
    statuses = ", ".join(f"{counts[s]} {s}" for s in ("pass", "Warning", "error", "SKIP") if counts[s]) or "none"
    line = (f"msprobe in-process: {sampling.calls} call(s), {len(records)} taken{sampled}: {statuses}; "
            f"{unchecked} not checked; results in {out}")
    if replay:
        line += f"; kept calls replay with: {replay}"
    failing = worst(records)
    if failing:
        line += "\n" + "\n".join(f"  FAILED {text}" for text in failing)
    ok = not counts["error"] and not unchecked
    return Summary(line, ok, counts, unchecked, records, paths, replay)
