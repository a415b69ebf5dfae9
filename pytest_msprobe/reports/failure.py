"""What a failed item prints: a one-line digest that pytest's short summary keeps, then a table of its outputs
with the numbers a user needs to judge it, its reasons and notes, and the command that checks it again. Plain
text from a record, so the journal, the repro scripts and the fuzz items print the same (no torch)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .results import PASS, REFERENCE_ONLY_MARK
from .summary import output_reasons, reason, severity, short_name, shorten

__all__ = ["DIGEST_LIMIT", "drew_inputs", "failure_digest", "format_failure"]


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        return f"{value:.6g}"
    return str(value)


def _short_dtype(dtype: Any) -> str:
    if dtype is None:
        return "-"
    text = str(dtype)
    return text[len("torch."):] if text.startswith("torch.") else text


def _index(index: Any) -> str:
    if index is None:
        return "-"
    if isinstance(index, (list, tuple)):
        return "[" + ", ".join(str(i) for i in index) + "]"
    return f"[{index}]"


_FAILURE_COLUMNS = ("output", "shape", "device", "bench", "verdict", "cosine", "max_abs_err",
                    "max_rel_err", "worst_idx", "worst_device", "worst_bench")


def failure_digest(record: Mapping[str, Any]) -> str | None:
    """The first line of a failure: its status and why (the worst output's reason), short, because pytest's short
    summary (`FAILED <node id> - <first line>`) cuts it to the terminal's width; None for a record that passed."""
    status = str(record.get("status", "?"))
    if status == PASS:
        return None
    return shorten(f"{status}: {reason(record, every=False)}", DIGEST_LIMIT)


DIGEST_LIMIT = 160


def format_failure(record: Mapping[str, Any], rerun: str) -> str:
    """Plain-text table for pytest's longrepr: a one-line digest, one aligned line per output with the numbers
    a user needs to judge the failure, then the item message, the seed where the inputs were drawn and a
    copy-paste rerun command."""
    direction = str(record.get("direction", ""))
    digest = failure_digest(record)
    lines = [] if digest is None else [digest]
    lines += [f"{record.get('api', '?')}.{direction}: {record.get('status', '?')}"
             f"  (device={record.get('device', '?')}, standard={record.get('standard', '?')}"
             + (f", contract={record['contract']}" if record.get("contract", "torch") != "torch" else "") + ")"]
    if record.get("reference_only"):
        lines.append(REFERENCE_ONLY_MARK)
    if record.get("kernel") or record.get("backend", record.get("device")) != record.get("device"):
        lines.append(f"implementation: {record.get('impl')} on {record.get('backend')}")  # --msprobe-kernels/-device
    if not str(record.get("bench_device", "cpu")).startswith("cpu"):  # msprobe_bench_device
        lines.append(f"bench: {record['bench_device']}; third run: {record.get('reference') or 'none'}")
    table: list[tuple[str, ...]] = []
    outputs = sorted(record.get("outputs") or (), key=severity)  # worst output first
    for out in outputs:
        metrics = out.get("metrics") or {}
        worst = out.get("worst") or {}
        shape = out.get("shape")
        table.append((
            short_name(str(out.get("name", "")), direction),
            "-" if shape is None else str(tuple(shape)),
            _short_dtype(out.get("device_dtype")),
            _short_dtype(out.get("bench_dtype")),
            str(out.get("verdict") or out.get("status") or "-"),
            _num(metrics.get("cosine")),
            _num(metrics.get("max_abs_err")),
            _num(metrics.get("max_rel_err")),
            _index(worst.get("index")) if worst else "-",
            _num(worst.get("device")) if worst else "-",
            _num(worst.get("bench")) if worst else "-",
        ))
    if table:
        widths = [max(len(row[i]) for row in [_FAILURE_COLUMNS, *table]) for i in range(len(_FAILURE_COLUMNS))]
        for row in [_FAILURE_COLUMNS, *table]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        for out in outputs:
            if (out.get("verdict") or out.get("status")) not in (PASS, None):
                short = short_name(str(out.get("name", "")), direction)
                lines += [f"{short}: {_indent(text)}" for text in output_reasons(out)]
    message = str(record.get("message") or "")
    if message:
        lines.append(f"message: {_indent(message)}")
    notes = [str(note) for note in record.get("notes") or ()]
    lines += [f"note: {_indent(note)}" for note in notes]
    if any("NaN planted" in note for note in notes) and any(_is_nan((o.get("metrics") or {}).get("cosine"))
                                                             for o in outputs):
        lines.append("cause: the recorded statistics hold NaN, so a NaN was planted in the inputs (note above); "
                     "it reaches the output on both sides, and a cosine over NaN is nan")
    if drew_inputs(record):  # the item's own seed, not the run's (--msprobe-seed, in the rerun line): both labelled
        lines.append(f"item seed: {record.get('seed')} (this call's inputs, derived from the run seed and the API "
                     "name)")
    lines.append(f"rerun: {rerun}")
    return "\n".join(lines)


def drew_inputs(record: Mapping[str, Any]) -> bool:
    """Whether the item's seed made its inputs: not where they are the dump's saved tensors (`data: real`); a
    record that does not say (a crash before its inputs were built) may have drawn them."""
    return record.get("data") != "real"


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _indent(text: str) -> str:
    return text.strip("\n").replace("\n", "\n    ")
