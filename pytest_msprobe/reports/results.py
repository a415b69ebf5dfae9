"""Result records -> msprobe-compatible CSV files and a JSONL archive (a failure's text: failure.py).

Every pytest item produces one plain-dict *record* (JSON-serialisable, so it can ride on the test
report from xdist workers to the controller). The controller calls :func:`write_results` once at
session end; writing everything at once from one process avoids the unlocked concurrent appends
msprobe's multi_run_ut does (REFERENCE-msprobe.md §5.7).

Record layout (see also the plugin)::

    {"nodeid", "dump", "api", "direction": "forward"|"backward",
     "status": "pass"|"Warning"|"error"|"SKIP", "message", "seed", "device", "standard", "duration_s",
     "outputs": [{"name", "status", "message", "bench_dtype", "device_dtype", "shape",
                  "metrics": {METRIC_KEYS -> float|int|None}, "worst": {...}|None}, ...]}

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
from ..verdict import ms_results

__all__ = [
    "DETAILS_HEADER", "RESULT_HEADER", "STATUSES", "timestamp", "api_results", "details_rows",
    "write_results", "read_jsonl", "summary_counts",
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


def api_results(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str, str | None]]:
    """Fold forward/backward items back into msprobe's one-row-per-API result table.

    msprobe runs both directions of an API in one go; we run them as separate pytest items, so the
    row is rebuilt here: first-seen API order, " " for a direction without a record, and a 4th
    (message) cell only when a direction is SKIP, as msprobe writes 3- or 4-cell rows (§5.2).
    The item status is already the aggregate over its outputs (§4.5), so it is copied verbatim.
    """
    by_api: dict[str, dict[str, Mapping[str, Any]]] = {}
    for rec in records:
        by_api.setdefault(str(rec["api"]), {}).setdefault(str(rec["direction"]), rec)
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


def _status(rec: Mapping[str, Any] | None) -> str:
    """run_ut's own (Layer-1) status; the selected standard's verdict goes to the compare files."""
    if rec is None:
        return BLANK
    return str(rec.get("layer1_status") or rec.get("status") or BLANK)


def _record_message(rec: Mapping[str, Any] | None) -> str:
    """Item message, else the first output's message (msprobe takes the first details row's)."""
    if rec is None:
        return ""
    message = rec.get("message") or ""
    if not message:
        for out in rec.get("outputs") or ():
            if out.get("message"):
                return str(out["message"])
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


def details_rows(records: Iterable[Mapping[str, Any]], precision: int = 14) -> list[list[str]]:
    """One 23-cell row per output, msprobe's details layout.

    An item that compared nothing (skipped, crashed before comparing) still gets one row named
    `{api}.{direction}.output.0` carrying its status and message, as msprobe writes for skipped
    APIs, so every item is visible in the CSV and api_precision_compare SKIPs it (blank dtype).
    """
    rows: list[list[str]] = []
    for rec in records:
        outputs = rec.get("outputs") or ()
        if not outputs:
            row = [f"{rec['api']}.{rec['direction']}.output.0"] + [BLANK] * (len(DETAILS_HEADER) - 3)
            row += [_status(rec), str(rec.get("message") or "")]
            rows.append(row)
            continue
        for out in outputs:
            metrics = out.get("metrics") or {}
            row = [
                str(out["name"]),
                _cell(out.get("bench_dtype"), precision),
                _cell(out.get("device_dtype"), precision),
                _shape_cell(out.get("shape")),
            ]
            row += [_cell(metrics.get(key), precision) for key in METRIC_KEYS]
            row += [_output_status(out), marked(rec, str(out.get("message") or ""))]
            rows.append(row)
    return rows


def _output_status(out: Mapping[str, Any]) -> str:
    return str(out.get("status") or BLANK)


def details_statuses(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many rows of the details CSVs carry each Status (run_ut's Layer-1 verdict, one row per output, as
    details_rows writes them), for the PyTorch records: MindSpore's files carry the selected standard's."""
    counts: dict[str, int] = {}
    for rec in records:
        if ms_results.is_mindspore(rec):
            continue
        for status in [_output_status(out) for out in rec.get("outputs") or ()] or [_status(rec)]:
            counts[status] = counts.get(status, 0) + 1
    return counts


REFERENCE_ONLY_MARK = "[reference only: the device side ran the bench function, no vendor kernel]"


def marked(rec: Mapping[str, Any], message: str) -> str:
    """A reference-vs-reference item's message says so (an NPU op checked on a machine without an NPU)."""
    if not rec.get("reference_only"):
        return message
    return f"{REFERENCE_ONLY_MARK} {message}".rstrip()


def reference_only(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Statuses of the items that compared the bench with itself (counted apart from real passes)."""
    counts: dict[str, int] = {}
    for rec in records:
        if rec.get("reference_only"):
            counts[str(rec.get("status"))] = counts.get(str(rec.get("status")), 0) + 1
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


def compare_rows(records: Iterable[Mapping[str, Any]], compare_keys: Sequence[str],
                 precision: int = 14) -> tuple[list[list[str]], list[list[str]]]:
    """(result rows, details rows) of api_precision_compare for records judged by a msprobe standard.

    An output without new-standard cells (fp64, scalars, no reference) is a SKIP row with the reason,
    as api_precision_compare SKIPs what it cannot judge.
    """
    details: list[list[str]] = []
    per_api: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for rec in records:
        for out in rec.get("outputs") or ():
            cells = out.get("compare")
            if cells:
                status = str(out.get("verdict") or out.get("status"))
                row = compare_detail_row(str(out["name"]), cells, status, str(out.get("verdict_message") or ""),
                                         compare_keys, precision)
            else:
                status = SKIP
                reason = out.get("verdict_message") or out.get("message") or "not judged by the new standard"
                row = compare_detail_row(str(out["name"]), None, SKIP, str(reason), compare_keys, precision)
            details.append(row)
            per_api.setdefault(str(rec["api"]), {}).setdefault(str(rec["direction"]), []).append((status, row[-1]))
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


def write_compare_results(records: list[dict[str, Any]], out_dir: Path, ts: str, compare_keys: Sequence[str],
                          precision: int = 14) -> dict[str, Path]:
    return write_compare_files(*compare_rows(records, compare_keys, precision), out_dir, ts)


# ----------------------------------------------------------------------------------------------
# files


def write_results(records: list[dict[str, Any]], out_dir: Path, ts: str | None = None,
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
    groups: dict[str, list[dict[str, Any]]] = {}
    labels = dump_labels([str(rec.get("dump") or "") for rec in records])
    for rec in records:
        groups.setdefault(labels.get(str(rec.get("dump") or ""), ""), []).append(rec)
    paths: dict[str, Path] = {}
    for label, group in groups.items() if groups else [("", [])]:
        written = _write_set(group, out_dir, f"{ts}_{label}" if label else ts, precision)
        paths.update({f"{k}:{label}" if label else k: v for k, v in written.items()})
    paths["jsonl"] = out_dir / f"{JSONL_PREFIX}{ts}.jsonl"
    with open(paths["jsonl"], "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, allow_nan=True))
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


def _write_set(records: list[dict[str, Any]], out_dir: Path, stem: str, precision: int) -> dict[str, Path]:
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
    if any(rec.get("standard") in ("msprobe", "msprobe26") for rec in records):
        from ..verdict.verdicts import COMPARE_KEYS

        judged = [rec for rec in records if rec.get("standard") in ("msprobe", "msprobe26")]
        paths.update(write_compare_results(judged, out_dir, stem, COMPARE_KEYS, precision))
    return paths


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Load a records archive. A run killed mid-write leaves a partial last line; that one is
    dropped instead of failing the whole file. Corruption anywhere else is a real error."""
    lines = Path(path).read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    records: list[dict[str, Any]] = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if lineno == len(lines):
                break
            raise ValueError(f"{path}:{lineno}: corrupt record line: {exc}") from exc
    return records


def summary_counts(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Item counts per msprobe status; the four literals always present (zero-filled, fixed order)
    so the terminal summary line has a stable shape. Unknown statuses are counted too."""
    counts = dict.fromkeys(STATUSES, 0)
    for rec in records:
        status = str(rec.get("status") or BLANK)
        counts[status] = counts.get(status, 0) + 1
    return counts
