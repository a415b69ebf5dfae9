"""What a failed item prints: a one-line digest that pytest's short summary keeps, then a table of its outputs
with the numbers a user needs to judge it, its reasons and notes, and the command that checks it again. Plain
text from a record, so the journal, the repro scripts and the fuzz items print the same (no torch)."""
from __future__ import annotations

import math
from typing import Any

from ..records.record import Record
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


def failure_digest(record: Record) -> str | None:
    """The first line of a failure: its status and why (the worst output's reason), short, because pytest's short
    summary (`FAILED <node id> - <first line>`) cuts it to the terminal's width; None for a record that passed."""
    status = record.status
    if status == PASS:
        return None
    return shorten(f"{status}: {reason(record, every=False)}", DIGEST_LIMIT)


DIGEST_LIMIT = 160


def format_failure(record: Record, rerun: str) -> str:
    """Plain-text table for pytest's longrepr: a one-line digest, one aligned line per output with the numbers
    a user needs to judge the failure, then the item message, the seed where the inputs were drawn and a
    copy-paste rerun command."""
    direction = record.direction
    digest = failure_digest(record)
    lines = [] if digest is None else [digest]
    standard = record.standard if record.has("standard") else "?"
    lines += [f"{record.api}.{direction}: {record.status}  (device={record.device}, standard={standard}"
              + (f", contract={record.contract}" if record.has("contract") and record.contract != "torch" else "")
              + ")"]
    if record.reference_only:
        lines.append(REFERENCE_ONLY_MARK)
    if record.kernel or (record.has("backend") and record.backend != record.device):
        lines.append(f"implementation: {record.impl} on {record.backend}")  # --msprobe-kernels/-device
    if record.has("bench_device") and not str(record.bench_device).startswith("cpu"):  # msprobe_bench_device
        lines.append(f"bench: {record.bench_device}; third run: {record.reference or 'none'}")
    table: list[tuple[str, ...]] = []
    outputs = sorted(record.outputs, key=severity)  # worst output first
    for out in outputs:
        metrics = out.metrics
        worst = out.worst or {}
        shape = out.shape
        table.append((
            short_name(out.name, direction),
            "-" if shape is None else str(tuple(shape)),
            _short_dtype(out.device_dtype),
            _short_dtype(out.bench_dtype),
            str(out.verdict or out.status or "-"),
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
            if (out.verdict or out.status) not in (PASS, None):
                short = short_name(out.name, direction)
                lines += [f"{short}: {_indent(text)}" for text in output_reasons(out)]
    message = record.message
    if message:
        lines.append(f"message: {_indent(message)}")
    notes = [str(note) for note in record.notes]
    lines += [f"note: {_indent(note)}" for note in notes]
    if any("NaN planted" in note for note in notes) and any(_is_nan(o.metrics.get("cosine"))
                                                             for o in outputs):
        lines.append("cause: the recorded statistics hold NaN, so a NaN was planted in the inputs (note above); "
                     "it reaches the output on both sides, and a cosine over NaN is nan")
    if drew_inputs(record):  # the item's own seed, not the run's (--msprobe-seed, in the rerun line): both labelled
        lines.append(f"item seed: {record.seed} (this call's inputs, derived from the run seed and the API "
                     "name)")
    lines.append(f"rerun: {rerun}")
    return "\n".join(lines)


def drew_inputs(record: Record) -> bool:
    """Whether the item's seed made its inputs: not where they are the dump's saved tensors (`data: real`); a
    record that does not say (a crash before its inputs were built) may have drawn them."""
    return record.data != "real"


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _indent(text: str) -> str:
    return text.strip("\n").replace("\n", "\n    ")
