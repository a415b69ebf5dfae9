"""Reference-device metrics from an earlier run: this plugin's JSON lines, or msprobe's details CSV.

Used by the benchmark and ULP algorithms when ini `msprobe_reference_results` is given (the
msprobe workflow: run on a GPU host, then judge the NPU run against it). Anything that does not
line up with the dump skips the item with the reason; it is never a silent pass.
"""
from __future__ import annotations

import csv
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..records.columns import DETAILS_HEADER, METRIC_KEYS
from ..runs.execution import NotCheckable


@dataclass
class ReferenceRow:
    device_dtype: str
    metrics: dict[str, float | None]
    where: str  # "file:line" for messages
    problems: list[str] = field(default_factory=list)


def _cell(text: str) -> tuple[float | None, str | None]:
    text = text.strip()
    if not text:
        return None, None
    try:
        return float(text), None
    except ValueError:
        return None, f"{text!r} is not a number"


@functools.lru_cache(maxsize=8)
def load(path: str) -> dict[str, ReferenceRow]:
    """Rows by details name (`Functional.linear.0.forward.output.0`)."""
    source = Path(path)
    if not source.is_file():
        raise NotCheckable(f"msprobe_reference_results: {source} does not exist")
    rows: dict[str, ReferenceRow] = {}
    if source.suffix == ".jsonl":
        with source.open(encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a run killed mid-line; its items have no reference
                for out in record.get("outputs", []):
                    metrics = out.get("metrics") or {}
                    rows[out["name"]] = ReferenceRow(out.get("device_dtype", ""), {k: metrics.get(k) for k in METRIC_KEYS},
                                                     f"{source.name}:{line_no}")
        return rows
    with source.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:len(DETAILS_HEADER)]] != list(DETAILS_HEADER):
            raise NotCheckable(f"msprobe_reference_results: {source} is not an msprobe accuracy_checking_details CSV")
        first_metric = DETAILS_HEADER.index("余弦相似度")
        for line_no, cells in enumerate(reader, 2):
            if not cells:
                continue
            row = ReferenceRow(cells[2].strip(), {}, f"{source.name}:{line_no}")
            for offset, key in enumerate(METRIC_KEYS):
                text = cells[first_metric + offset] if first_metric + offset < len(cells) else ""
                value, problem = _cell(text)
                row.metrics[key] = value
                if problem:
                    row.problems.append(f"column {DETAILS_HEADER[first_metric + offset]}: {problem}")
            rows[cells[0].strip()] = row
    return rows


def lookup(path: str, name: str, device_dtype: str) -> dict[str, float | None]:
    row = load(path).get(name)
    if row is None:
        raise NotCheckable(f"reference results {path} have no row {name} (the reference run did not check this API)")
    if row.problems:
        raise NotCheckable(f"reference results {row.where} ({name}): {'; '.join(row.problems)}")
    if row.device_dtype != device_dtype:
        raise NotCheckable(f"reference results {row.where}: {name} was {row.device_dtype or 'blank'} there, "
                           f"{device_dtype} here")
    if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in row.metrics.values()):
        raise NotCheckable(f"reference results {row.where}: {name} has no metrics")
    return row.metrics


__all__ = ["ReferenceRow", "load", "lookup"]
