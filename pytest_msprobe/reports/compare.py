"""`python -m pytest_msprobe compare`: msprobe's api_precision_compare on two existing details CSVs.

For users who already hold an NPU details CSV and a GPU (or other reference device) details CSV, from
msprobe's run_ut/acc_check or from pytest-msprobe (the same 23 columns). Each NPU row is judged by the
row-level rules of verdicts.py (the ones the plugin applies to its items) and the per-direction fold of
report.py; this module only walks the two files the way msprobe 8.3.3's api_precision_compare does, so
the per-API verdicts are its verdicts:

* rows are matched by `API Name`; an NPU row without a GPU row is left out (msprobe: a warning), a name
  twice in the GPU file is an error;
* a row with a blank DEVICE Dtype, an fp64/complex dtype or shape (0,) is SKIP with the NPU row's message;
* a metric cell the algorithm needs that is blank or not a number makes the row SKIP with its own result
  row (8.3.3 raises there; `msprobe26` reads a blank cell as 0, as 26.x does);
* consecutive rows of one API make one result row; fp64/complex rows do not count, and an API whose last
  row is fp64/complex is SKIP "This data type does not support benchmark compare.".

Torch-free: numbers and names only.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..metrics.vectorised import METRIC_KEYS
from ..verdict import verdicts
from ..verdict.layer2 import algorithm_for
from .results import BLANK, DETAILS_HEADER, ERROR, SKIP, compare_detail_row, compare_status

UNSUPPORTED_MESSAGE = "This data type does not support benchmark compare."
ZERO_SHAPE = "(0,)"
_COLUMN = dict(zip(METRIC_KEYS, DETAILS_HEADER[4:4 + len(METRIC_KEYS)]))  # metrics key -> CSV column
REQUIRED = ("API Name", "DEVICE Dtype", "Shape", "Message") + tuple(
    _COLUMN[k] for k in ("small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err", "error_balance",
                         "binary_error_rate", "inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio", "mean_ulp_err",
                         "ulp_err_proportion", "dual_thousandth"))


class CompareError(Exception):
    """Input files that cannot be compared at all (missing columns, a name twice in the GPU file)."""


class _BadCell(Exception):
    """A metric cell the row's algorithm needs is blank or not a number: the row is SKIP with this text."""


def read_details(path: Path, role: str) -> list[dict[str, str]]:
    """The rows of an accuracy_checking_details CSV as {column: text}; CompareError naming what is wrong."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            rows = [dict(zip(header, cells)) for cells in reader if cells]
    except OSError as exc:
        raise CompareError(f"--{role} {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise CompareError(f"--{role} {path}: not UTF-8 text ({exc.reason})") from None
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        hint = " (a MindSpore checker CSV? api_precision_compare is for PyTorch details)" \
            if "Tested Dtype" in header else ""
        raise CompareError(f"--{role} {path}: not an accuracy_checking_details CSV: missing column(s) "
                           f"{', '.join(missing)}{hint}")
    return rows


def _segments(name: str) -> tuple[str, str, str] | None:
    """(bare API name, API full name, direction) of `Type.api.0.forward.output.0`; 7 parts: `linalg.inv`."""
    parts = name.split(".")
    if len(parts) == 6:
        return parts[1], ".".join(parts[:3]), parts[3]
    if len(parts) == 7:
        return ".".join(parts[1:3]), ".".join(parts[:4]), parts[4]
    return None


# msprobe reads the CSVs with pandas, which turns these cells (and an empty one) into NaN; " " stays text.
_NA_TEXT = frozenset(("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                      "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"))


def _metrics(row: Mapping[str, str], keys: tuple[str, ...], blank_as_zero: bool) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in keys:
        raw = str(row.get(_COLUMN[key], ""))
        if raw in _NA_TEXT:
            out[key] = math.nan
            continue
        text = raw.strip()
        if not text:
            if not blank_as_zero:
                raise _BadCell("ERROR: Input data is an empty string")
            out[key] = None  # verdicts read None as 0.0
            continue
        try:
            out[key] = float(text)
        except ValueError:
            raise _BadCell("ERROR: Input data cannot be converted to float") from None
    return out


def _judge(npu: Mapping[str, str], gpu: Mapping[str, str], api_name: str, specs: Mapping[str, Any],
           standard: str) -> tuple[str, str, dict[str, Any] | None]:
    """(status, message, details cells) of one NPU row against its GPU row."""
    th, cats = specs["thresholds"], specs["categories"]
    dtype = str(npu.get("DEVICE Dtype", ""))
    if not dtype.strip() or dtype in cats["api_precision_compare_unsupported"] or npu.get("Shape") == ZERO_SHAPE:
        return SKIP, str(npu.get("Message", "")), None
    algorithm = algorithm_for(api_name, dtype, cats, standard)
    keys = verdicts.INPUT_KEYS[algorithm]
    mine = _metrics(npu, keys, standard == "msprobe26")
    if verdicts.needs_reference(algorithm, dtype, th):
        ref = _metrics(gpu, keys, standard == "msprobe26")
        status, message, cells = verdicts.with_reference(algorithm, mine, ref, dtype,
                                                         verdicts.ApiRules(api_name, standard, th))
    else:
        status, message, cells = verdicts.single_run(algorithm, mine, dtype, th)
    cells["algorithm_name"] = cats["algorithm_names"].get(algorithm, algorithm)
    return status, message, cells


def compare_files(npu_path: Path, gpu_path: Path, specs: Mapping[str, Any], standard: str = "msprobe",
                  precision: int = 14) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """(result rows, details rows, NPU row names without a GPU row) of api_precision_compare."""
    npu_rows = read_details(npu_path, "npu")
    gpu_by_name: dict[str, list[dict[str, str]]] = {}
    for row in read_details(gpu_path, "gpu"):
        gpu_by_name.setdefault(row.get("API Name", ""), []).append(row)
    unsupported = specs["categories"]["api_precision_compare_unsupported"]
    results: list[list[str]] = []
    details: list[list[str]] = []
    missing: list[str] = []
    group: dict[str, Any] = {"api": None, "dtype": None, "forward": [], "backward": [], "skip_message": ""}

    def flush() -> None:
        api = group["api"]
        if group["dtype"] in unsupported:
            results.append([api, SKIP, SKIP, UNSUPPORTED_MESSAGE])
        else:
            fwd, bwd = compare_status(group["forward"]), compare_status(group["backward"])
            message = verdicts.API_HINTS.get(api.split(".", 1)[1].rsplit(".", 1)[0], "") if fwd == ERROR else ""
            message += group["skip_message"] if fwd == SKIP else ""
            results.append([api, fwd, bwd, message])
        group.update(forward=[], backward=[], skip_message="")

    for npu in npu_rows:
        name = npu.get("API Name", "")
        parsed = _segments(name)
        if parsed is None:
            text = f"The API name {name} is invalid."
            details.append(compare_detail_row(name, None, SKIP, text, verdicts.COMPARE_KEYS, precision))
            results.append([name, SKIP, SKIP, text])
            continue
        api_name, full_name, direction = parsed
        gpu = gpu_by_name.get(name)
        if not gpu:
            missing.append(name)
            continue
        if len(gpu) > 1:
            raise CompareError(f"--gpu {gpu_path}: {name} has {len(gpu)} rows; which one is its reference cannot "
                               "be told")
        try:
            status, message, cells = _judge(npu, gpu[0], api_name, specs, standard)
        except _BadCell as exc:
            details.append(compare_detail_row(name, None, SKIP, str(exc), verdicts.COMPARE_KEYS, precision))
            results.append([name, SKIP, SKIP, str(exc)])
            continue
        details.append(compare_detail_row(name, cells, status, message, verdicts.COMPARE_KEYS, precision))
        if group["api"] is not None and full_name != group["api"]:
            flush()
        group["api"], group["dtype"] = full_name, npu.get("DEVICE Dtype")
        if group["dtype"] in unsupported:
            continue
        if direction == "forward":
            group["forward"].append(status)
            group["skip_message"] = str(npu.get("Message", "")) if status == SKIP else ""
        elif direction == "backward":
            group["backward"].append(status)
    if group["api"] is not None:
        flush()
    return results, details, missing


def summary(results: list[list[str]]) -> str:
    """`N APIs: a pass, b error, ...` over the forward/backward cells of the result rows."""
    counts: dict[str, int] = {}
    for row in results:
        for cell in row[1:3]:
            if cell != BLANK:
                counts[cell] = counts.get(cell, 0) + 1
    shown = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return f"{len(results)} APIs; forward/backward verdicts: {shown or 'none'}"


__all__ = ["CompareError", "compare_files", "read_details", "summary"]
