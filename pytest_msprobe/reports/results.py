"""Result records -> msprobe-compatible CSV files and a JSONL archive (a failure's text: failure.py).

Every pytest item produces one *record* (records/record.py: `Record`, its output rows `Row`). The
controller calls :func:`write_results` once at session end; writing everything at once from one
process avoids the unlocked concurrent appends msprobe's multi_run_ut does (REFERENCE-msprobe.md §5.7).
The JSONL archive holds each record's plain form (`Record.to_dict`), which :func:`read_records` reads back.

The CSV layouts follow msprobe's run_ut files byte for byte where it matters to its own tools
(headers, status literals, blank " " cells, "{:.14f}" floats, tuple-repr shapes; §5.2, A.12) so
`msprobe api_precision_compare` can read our details CSV. This module must not import torch: the
controller may run without it and the report code has to stay cheap to import.
"""
from __future__ import annotations

import csv
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from ..records.columns import DETAILS_HEADER, METRIC_KEYS
from ..records.record import Record, Row
from ..verdict import ms_results

__all__ = [
    "DETAILS_HEADER", "RESULT_HEADER", "STATUSES", "timestamp", "api_results", "details_rows",
    "write_results", "read_jsonl", "read_records", "summary_counts",
]

# msprobe's literal strings (A.12 status_literals); a blank cell is a single space, not "".
PASS, WARNING, ERROR, SKIP, BLANK = "pass", "Warning", "error", "SKIP", " "
STATUSES: tuple[str, ...] = (PASS, WARNING, ERROR, SKIP)

RESULT_HEADER: tuple[str, ...] = ("API name", "Forward Test Success", "Backward Test Success", "Message")

RESULT_PREFIX = "accuracy_checking_result_"
DETAILS_PREFIX = "accuracy_checking_details_"
JSONL_PREFIX = "msprobe_records_"
CSV_ENCODING = "utf-8-sig"   # msprobe writes a BOM; its readers (pandas, csv) expect either


def timestamp() -> str:
    """Local time as msprobe stamps its output files (14 digits, so its resume regex accepts them)."""
    return time.strftime("%Y%m%d%H%M%S")


# ----------------------------------------------------------------------------------------------
# result CSV (one row per API)


def api_results(records: Iterable[Record]) -> list[tuple[str, str, str, str | None]]:
    """Fold forward/backward items back into msprobe's one-row-per-API result table.

    msprobe runs both directions of an API in one go; we run them as separate pytest items, so the
    row is rebuilt here: first-seen API order, " " for a direction without a record, and a 4th
    (message) cell only when a direction is SKIP, as msprobe writes 3- or 4-cell rows (§5.2).
    The item status is already the aggregate over its outputs (§4.5), so it is copied verbatim.
    """
    by_api: dict[str, dict[str, Record]] = {}
    for rec in records:
        by_api.setdefault(rec.api, {}).setdefault(rec.direction, rec)
    rows: list[tuple[str, str, str, str | None]] = []
    for api, directions in by_api.items():
        fwd = directions.get("forward")
        bwd = directions.get("backward")
        fwd_status = _status(fwd)
        bwd_status = _status(bwd)
        message: str | None = None
        if fwd_status == SKIP or bwd_status == SKIP:
            skipped = fwd if fwd_status == SKIP else bwd
            message = _record_message(skipped)
        rows.append((api, fwd_status, bwd_status, message))
    return rows


def _status(rec: Record | None) -> str:
    """run_ut's own (Layer-1) status; the selected standard's verdict goes to the compare files."""
    if rec is None:
        return BLANK
    return str(rec.layer1_status or rec.status or BLANK)


def _record_message(rec: Record | None) -> str:
    """Item message, else the first output's message (msprobe takes the first details row's)."""
    if rec is None:
        return ""
    message = rec.message or ""
    if not message:
        for out in rec.outputs:
            if out.message:
                return out.message
    return str(message)


# ----------------------------------------------------------------------------------------------
# details CSV (one row per compared output)


def _cell(value: Any, precision: int) -> str:
    """msprobe's cell rule: Python floats as fixed-point with `precision` digits, None blank."""
    if value is None:
        return BLANK
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return "{:.{}f}".format(value, precision)   # nan/inf stay "nan"/"inf" like msprobe
    return str(value)


def _shape_cell(shape: Sequence[int] | None) -> str:
    if shape is None:
        return BLANK
    return str(tuple(int(s) for s in shape))         # "(4, 32)", "(4,)", "()"


def details_rows(records: Iterable[Record], precision: int = 14) -> list[list[str]]:
    """One 23-cell row per output, msprobe's details layout.

    An item that compared nothing (skipped, crashed before comparing) still gets one row named
    `{api}.{direction}.output.0` carrying its status and message, as msprobe writes for skipped
    APIs, so every item is visible in the CSV and api_precision_compare SKIPs it (blank dtype).
    """
    rows: list[list[str]] = []
    for rec in records:
        if not rec.outputs:
            row = [f"{rec.api}.{rec.direction}.output.0"] + [BLANK] * (len(DETAILS_HEADER) - 3)
            row += [_status(rec), rec.message]
            rows.append(row)
            continue
        for out in rec.outputs:
            metrics = out.metrics
            row = [
                out.name,
                _cell(out.bench_dtype, precision),
                _cell(out.device_dtype, precision),
                _shape_cell(out.shape),
            ]
            row += [_cell(metrics.get(key), precision) for key in METRIC_KEYS]
            row += [_output_status(out), marked(rec, out.message)]
            rows.append(row)
    return rows


def _output_status(out: Row) -> str:
    return str(out.status or BLANK)


def details_statuses(records: Iterable[Record]) -> dict[str, int]:
    """How many rows of the details CSVs carry each Status (run_ut's Layer-1 verdict, one row per output, as
    details_rows writes them), for the PyTorch records: MindSpore's files carry the selected standard's."""
    counts: dict[str, int] = {}
    for rec in records:
        if ms_results.is_mindspore(rec):
            continue
        for status in [_output_status(out) for out in rec.outputs] or [_status(rec)]:
            counts[status] = counts.get(status, 0) + 1
    return counts


REFERENCE_ONLY_MARK = "[reference only: the device side ran the bench function, no vendor kernel]"


def marked(rec: Record, message: str) -> str:
    """A reference-vs-reference item's message says so (an NPU op checked on a machine without an NPU)."""
    if not rec.reference_only:
        return message
    return f"{REFERENCE_ONLY_MARK} {message}".rstrip()


def reference_only(records: Iterable[Record]) -> dict[str, int]:
    """Statuses of the items that compared the bench with itself (counted apart from real passes)."""
    counts: dict[str, int] = {}
    for rec in records:
        if rec.reference_only:
            counts[rec.status] = counts.get(rec.status, 0) + 1
    return counts


# ----------------------------------------------------------------------------------------------
# api_precision_compare files (msprobe's new standard, §5.3)

COMPARE_RESULT_HEADER: tuple[str, ...] = ("API Name", "Forward Test Success", "Backward Test Success", "Message")
COMPARE_DETAILS_HEADER: tuple[str, ...] = (
    "API Name", "小值域错误比值", "小值域判定结果", "均方根误差比值", "均方根误差判定结果",
    "相对误差最大值比值", "相对误差最大值判定结果", "相对误差平均值比值", "相对误差平均值判定结果", "误差均衡性比值",
    "误差均衡性判定结果", "inf/nan错误率", "inf/nan判定结果", "相对误差错误率", "相对误差判定结果", "绝对误差错误率",
    "绝对误差判定结果", "二进制一致错误率", "二进制一致错误率判定结果", "ULP误差平均值", "ULP误差大于阈值占比",
    "ULP误差大于阈值占比比值", "ULP误差判定结果", "双千指标", "双千指标判定结果", "比对结果", "比对算法", "Message",
)
COMPARE_RESULT_PREFIX = "api_precision_compare_result_"
COMPARE_DETAILS_PREFIX = "api_precision_compare_details_"


def compare_status(statuses: list[str]) -> str:
    """msprobe's per-direction fold: blank, all-SKIP, error, Warning, pass."""
    if not statuses:
        return BLANK
    if all(s == SKIP for s in statuses):
        return SKIP
    for status in (ERROR, WARNING):
        if status in statuses:
            return status
    return PASS


def compare_detail_row(name: str, cells: Mapping[str, Any] | None, status: str, message: str,
                       compare_keys: Sequence[str], precision: int = 14) -> list[str]:
    """One api_precision_compare details row; without cells (not judged) every metric cell is blank."""
    cells = cells or {}
    return [name] + [_cell(cells.get(k), precision) for k in compare_keys] + [
        status, str(cells.get("algorithm_name", BLANK)), message]


def compare_rows(records: Iterable[Record], compare_keys: Sequence[str],
                 precision: int = 14) -> tuple[list[list[str]], list[list[str]]]:
    """(result rows, details rows) of api_precision_compare for records judged by a msprobe standard.

    An output without new-standard cells (fp64, scalars, no reference) is a SKIP row with the reason,
    as api_precision_compare SKIPs what it cannot judge.
    """
    details: list[list[str]] = []
    per_api: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for rec in records:
        for out in rec.outputs:
            cells = out.compare
            if cells:
                status = str(out.verdict or out.status)
                row = compare_detail_row(out.name, cells, status, out.verdict_message,
                                         compare_keys, precision)
            else:
                status = SKIP
                reason = out.verdict_message or out.message or "not judged by the new standard"
                row = compare_detail_row(out.name, None, SKIP, str(reason), compare_keys, precision)
            details.append(row)
            per_api.setdefault(rec.api, {}).setdefault(rec.direction, []).append((status, row[-1]))
    results = []
    for api, directions in per_api.items():
        fwd = compare_status([s for s, _ in directions.get("forward", [])])
        bwd = compare_status([s for s, _ in directions.get("backward", [])])
        message = directions["forward"][0][1] if fwd == SKIP else ""
        results.append([api, fwd, bwd, message])
    return results, details


def write_compare_files(results: list[list[str]], details: list[list[str]], out_dir: Path,
                        ts: str) -> dict[str, Path]:
    """api_precision_compare_result/details_<ts>.csv from their rows."""
    paths = {"compare_result": Path(out_dir) / f"{COMPARE_RESULT_PREFIX}{ts}.csv",
             "compare_details": Path(out_dir) / f"{COMPARE_DETAILS_PREFIX}{ts}.csv"}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for key, header, rows in (("compare_result", COMPARE_RESULT_HEADER, results),
                              ("compare_details", COMPARE_DETAILS_HEADER, details)):
        with open(paths[key], "w", encoding=CSV_ENCODING, newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)
    return paths


def write_compare_results(records: Iterable[Record], out_dir: Path, ts: str, compare_keys: Sequence[str],
                          precision: int = 14) -> dict[str, Path]:
    return write_compare_files(*compare_rows(records, compare_keys, precision), out_dir, ts)


# ----------------------------------------------------------------------------------------------
# files


def write_results(records: Sequence[Record], out_dir: Path, ts: str | None = None,
                   precision: int = 14) -> dict[str, Path]:
    """Write the result CSV, details CSV (msprobe names, one shared timestamp) and a JSONL archive.

    msprobe's CSVs name a call without its dump, so a run over several dumps (ranks, steps, models)
    writes one CSV set per dump, as msprobe does per rank: `..._<ts>_<dump label>.csv`, the label being
    the dump's folder past the folders all dumps share (`rank0`, `step1_rank3`). Keys are then
    `<kind>:<label>`. The one JSONL keeps every record with its dump, and everything the CSVs flatten
    away (seed, worst element, durations), so later tooling can re-render or re-judge a run without
    re-executing it. Records are written in the order given (the caller decides, e.g. dump order).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ts = ts or timestamp()
    groups: dict[str, list[Record]] = {}
    labels = dump_labels([str(rec.dump or "") for rec in records])
    for rec in records:
        groups.setdefault(labels.get(str(rec.dump or ""), ""), []).append(rec)
    paths: dict[str, Path] = {}
    for label, group in groups.items() if groups else [("", [])]:
        written = _write_set(group, out_dir, f"{ts}_{label}" if label else ts, precision)
        paths.update({f"{k}:{label}" if label else k: v for k, v in written.items()})
    paths["jsonl"] = out_dir / f"{JSONL_PREFIX}{ts}.jsonl"
    with open(paths["jsonl"], "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec.to_dict(), ensure_ascii=False, allow_nan=True))
            f.write("\n")
    return paths


def dump_tails(dumps: Sequence[str]) -> dict[str, str]:
    """{dump path: its path past the folders all dumps share} (`rank1/dump.json`); "" with one dump."""
    distinct = list(dict.fromkeys(dumps))
    if len(distinct) <= 1:
        return dict.fromkeys(distinct, "")
    paths = {dump: PurePosixPath(dump.replace("\\", "/")) for dump in distinct}
    folders = {dump: [p for p in path.parent.parts if p not in ("", ".", "/")] for dump, path in paths.items()}
    shared = 0  # every dump keeps at least its own folder
    while all(len(f) > shared + 1 for f in folders.values()) and len({f[shared] for f in folders.values()}) == 1:
        shared += 1
    return {dump: "/".join([*folders[dump][shared:], path.name]) for dump, path in paths.items()}


def dump_folders(dumps: Sequence[str]) -> dict[str, str]:
    """{dump path: its folder past the folders all dumps share} (`step0/rank1`): how headings and the HTML page
    tell dumps apart; "" with one dump."""
    return {dump: tail.removesuffix("/dump.json") for dump, tail in dump_tails(dumps).items()}


def dump_labels(dumps: Sequence[str]) -> dict[str, str]:
    """{dump path: file-name-safe label of its tail} (`rank1`, `step1_rank3`); "" with one dump."""
    labels: dict[str, str] = {}
    for dump, tail in dump_tails(dumps).items():
        path = PurePosixPath(tail)
        parts = [*path.parent.parts] + ([path.stem] if path.name != "dump.json" else [])
        label = re.sub(r"[^A-Za-z0-9_.\-]+", "_", "_".join(p for p in parts if p != ".")).strip("_")
        label = label or ("dump" if tail else "")
        labels[dump] = label if not label or label not in labels.values() else f"{label}_{len(labels)}"
    return labels


def _write_set(records: list[Record], out_dir: Path, stem: str, precision: int) -> dict[str, Path]:
    """One msprobe file set: run_ut's result and details CSVs (the MindSpore checker's for MindSpore
    records, with `_mindspore` beside PyTorch ones) and api_precision_compare's for msprobe standards."""
    paths = {"result": out_dir / f"{RESULT_PREFIX}{stem}.csv", "details": out_dir / f"{DETAILS_PREFIX}{stem}.csv"}
    ms_records = [rec for rec in records if ms_results.is_mindspore(rec)]
    pt_records = [rec for rec in records if not ms_results.is_mindspore(rec)] if ms_records else records
    if pt_records or not ms_records:
        with open(paths["result"], "w", encoding=CSV_ENCODING, newline="") as f:
            writer = csv.writer(f)
            writer.writerow(RESULT_HEADER)
            for api, fwd, bwd, message in api_results(pt_records):
                writer.writerow([api, fwd, bwd] if message is None else [api, fwd, bwd, message])
        with open(paths["details"], "w", encoding=CSV_ENCODING, newline="") as f:
            writer = csv.writer(f)
            writer.writerow(DETAILS_HEADER)
            writer.writerows(details_rows(pt_records, precision=precision))
    if ms_records:
        ms_paths = ms_results.write_files(ms_records, out_dir, stem, suffix="_mindspore" if pt_records else "",
                                          precision=precision)
        paths.update(ms_paths if not pt_records else {f"mindspore_{k}": v for k, v in ms_paths.items()})
    if any(rec.standard in ("msprobe", "msprobe26") for rec in records):
        from ..verdict.verdicts import COMPARE_KEYS

        judged = [rec for rec in records if rec.standard in ("msprobe", "msprobe26")]
        paths.update(write_compare_results(judged, out_dir, stem, COMPARE_KEYS, precision))
    return paths


def _json_lines(path: str | Path) -> list[tuple[int, Any]]:
    """(line number, value) of each line of a JSON lines file. A run killed mid-write leaves a partial
    last line; that one is dropped instead of failing the whole file. Corruption anywhere else is a
    real error (ValueError naming the file and line)."""
    lines = Path(path).read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    values: list[tuple[int, Any]] = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            values.append((lineno, json.loads(raw.decode("utf-8"))))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if lineno == len(lines):
                break
            raise ValueError(f"{path}:{lineno}: corrupt record line: {exc}") from exc
    return values


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The plain lines of a JSON lines file, for files that hold more than records (the journal's run
    lines); a records archive is read with :func:`read_records`."""
    return [value for _, value in _json_lines(path)]


def read_records(path: str | Path) -> list[Record]:
    """Load a records archive (`write_results`' JSONL) as records; a line that is JSON but not a record
    is a ValueError naming the file and line, as a corrupt line is."""
    records: list[Record] = []
    for lineno, value in _json_lines(path):
        try:
            if not isinstance(value, dict):
                raise ValueError(f"a JSON {type(value).__name__}, not an object")
            records.append(Record.from_dict(value))
        except (ValueError, TypeError) as exc:  # TypeError: a value of another type (outputs not a list of objects)
            raise ValueError(f"{path}:{lineno}: not a record: {exc}") from None
    return records


def summary_counts(records: Iterable[Record]) -> dict[str, int]:
    """Item counts per msprobe status; the four literals always present (zero-filled, fixed order)
    so the terminal summary line has a stable shape. Unknown statuses are counted too."""
    counts = dict.fromkeys(STATUSES, 0)
    for rec in records:
        status = str(rec.status or BLANK)
        counts[status] = counts.get(status, 0) + 1
    return counts
