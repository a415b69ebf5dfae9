"""msprobe's MindSpore checker: its verdict rule and its CSV files (REFERENCE-msprobe.md §7.5, §7.6).

Torch-free (numpy, imported where the metrics are computed, and the api_specs YAML): the `mindspore` standard applies the rule in
judge.py, and the controller writes the files for MindSpore dumps from the records.

The rule: cosine > 0.99 and max abs error < 0.001 (api_specs/thresholds.yaml `mindspore:`), with
msprobe's formulas (float64, flattened, 1e-8 guards). msprobe's weak spots are not copied: the bench
here computes in raised precision, random inputs are distinct per argument, and scalar / integer
outputs are compared exactly instead of always being `error`.
"""
from __future__ import annotations

import csv
import functools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..records.record import Record, Row

MS_FRAMEWORKS = ("mindspore", "mindtorch")
DETAILS_HEADER: tuple[str, ...] = ("API Name", "Bench Dtype", "Tested Dtype", "Shape", "Cosine", "MaxAbsErr",
                                   "MaxRelativeErr", "Status", "Message")
RESULT_HEADER: tuple[str, ...] = ("API Name", "Forward Test Success", "Backward Test Success", "Message")
BLANK = " "
CSV_ENCODING = "utf-8-sig"


def is_mindspore(record: Record) -> bool:
    """A record of a MindSpore (or mindtorch) dump: written in the MindSpore checker's layout."""
    return record.framework in MS_FRAMEWORKS


def ms_metrics(bench: Any, device: Any, epsilon: float = 1e-8) -> dict[str, float | None]:
    """Cosine, max abs and max relative error as msprobe's MindSpore checker computes them (§7.5)."""
    import numpy as np  # here: the controller imports this module to write files, without numpy

    b = np.asarray(bench, dtype=np.float64).reshape(-1)
    d = np.asarray(device, dtype=np.float64).reshape(-1)
    if b.shape != d.shape or b.size == 0:
        return {"cosine": None, "max_abs_err": None, "max_rel_err": None}
    with np.errstate(all="ignore"):
        cosine = (epsilon + np.dot(b, d)) / (epsilon + np.linalg.norm(b) * np.linalg.norm(d))
        diff = np.abs(b - d)
        rel = diff / (np.abs(b) + (b == 0) * epsilon)
        return {"cosine": float(cosine), "max_abs_err": float(np.max(diff)), "max_rel_err": float(np.max(rel))}


def ms_status(metrics: Mapping[str, Any], rule: Mapping[str, Any]) -> tuple[str, str]:
    """pass iff cosine > cosine_pass_gt and max abs error < max_abs_err_pass_lt; else error, saying which."""
    cosine, max_abs = metrics.get("cosine"), metrics.get("max_abs_err")
    if cosine is None or max_abs is None:
        return "error", "no metrics: shapes differ or the tensor is empty"
    cos_ok = cosine > rule["cosine_pass_gt"]  # NaN compares False: a NaN fails, as in msprobe
    abs_ok = max_abs < rule["max_abs_err_pass_lt"]
    text = (f"cosine {cosine:.8g} {'>' if cos_ok else 'is not >'} {rule['cosine_pass_gt']}, "
            f"max abs error {max_abs:.6g} {'<' if abs_ok else 'is not <'} {rule['max_abs_err_pass_lt']} "
            "(msprobe's MindSpore rule)")
    return ("pass" if cos_ok and abs_ok else "error"), text


@functools.lru_cache(maxsize=1)
def _dtype_names() -> dict[str, str]:
    """torch dtype string -> MindSpore dtype string, from api_specs/mindspore.yaml."""
    from ..specs.loader import load_specs

    table = load_specs()["mindspore"]["dtypes"]
    return {torch_name: ms_name for ms_name, torch_name in table.items() if torch_name}


def ms_dtype(dtype: Any) -> str:
    """`torch.float32` -> `Float32` (the MindSpore name the checker writes); other text unchanged."""
    text = str(dtype) if dtype is not None else BLANK
    return _dtype_names().get(text, text)


def _cell(value: Any, precision: int) -> str:
    if value is None:
        return BLANK
    if isinstance(value, float):
        return "{:.{}f}".format(value, precision)
    return str(value)


def _shape(shape: Any) -> str:
    return BLANK if shape is None else str(tuple(int(s) for s in shape))


def _status(out: Row) -> str:
    return str(out.verdict or out.status or BLANK)


def details_rows(records: Iterable[Record], precision: int = 14) -> list[list[str]]:
    """One row per compared output: the verdict of the selected standard, msprobe's MindSpore metrics."""
    rows: list[list[str]] = []
    for rec in records:
        if not rec.outputs:
            rows.append([f"{rec.api}.{rec.direction}.output.0", BLANK, BLANK, BLANK, BLANK, BLANK, BLANK,
                         str(rec.status or BLANK), rec.message or ""])
            continue
        for out in rec.outputs:
            metrics = out.ms_metrics or {}
            message = out.verdict_message or out.message or ""
            rows.append([out.name, ms_dtype(out.bench_dtype), ms_dtype(out.device_dtype),
                         _shape(out.shape), _cell(metrics.get("cosine"), precision),
                         _cell(metrics.get("max_abs_err"), precision), _cell(metrics.get("max_rel_err"), precision),
                         _status(out), str(message)])
    return rows


def result_rows(records: Iterable[Record]) -> list[list[str]]:
    """One row per API (forward and backward items folded), 4th cell only when a direction is SKIP."""
    by_api: dict[str, dict[str, Record]] = {}
    for rec in records:
        by_api.setdefault(rec.api, {}).setdefault(rec.direction, rec)
    rows = []
    for api, directions in by_api.items():
        cells = [str(directions[d].status or BLANK) if d in directions else BLANK for d in ("forward", "backward")]
        row = [api, *cells]
        skipped = next((directions[d] for d, c in zip(("forward", "backward"), cells) if c == "SKIP"), None)
        if skipped is not None:
            row.append(skipped.message or "")
        rows.append(row)
    return rows


def write_files(records: Sequence[Record], out_dir: Path, ts: str, *, suffix: str = "",
                precision: int = 14) -> dict[str, Path]:
    """accuracy_checking_result/details_<ts><suffix>.csv in the MindSpore checker's layout."""
    paths = {"result": Path(out_dir) / f"accuracy_checking_result_{ts}{suffix}.csv",
             "details": Path(out_dir) / f"accuracy_checking_details_{ts}{suffix}.csv"}
    for key, header, rows in (("result", RESULT_HEADER, result_rows(records)),
                              ("details", DETAILS_HEADER, details_rows(records, precision))):
        with open(paths[key], "w", encoding=CSV_ENCODING, newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)
    return paths
