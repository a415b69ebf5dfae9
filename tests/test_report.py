"""Report writing: msprobe CSV layouts, the JSONL archive, failure text and msprobe's own reader."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.metrics.vectorised import METRIC_KEYS
from pytest_msprobe.records.record import Record, Row
from pytest_msprobe.reports.failure import DIGEST_LIMIT, failure_digest, format_failure
from pytest_msprobe.reports.results import (
    DETAILS_HEADER,
    RESULT_HEADER,
    api_results,
    details_rows,
    details_statuses,
    read_jsonl,
    read_records,
    summary_counts,
    timestamp,
    write_results,
)

# Appendix A.12 of REFERENCE-msprobe.md, typed out independently of report.py.
A12_DETAILS = [
    "API Name", "Bench Dtype", "DEVICE Dtype", "Shape", "余弦相似度", "最大绝对误差", "双百指标", "双千指标",
    "双万指标", "二进制一致错误率", "误差均衡性", "均方根误差", "小值域错误占比", "相对误差最大值", "相对误差平均值",
    "inf/nan错误率", "相对误差错误率", "绝对误差错误率", "ULP误差最大值", "ULP误差平均值", "ULP误差大于阈值占比",
    "Status", "Message",
]
A12_ENGLISH = [
    "api_name", "bench_dtype", "device_dtype", "shape", "cosine", "max_abs_err", "dual_hundredth_ratio",
    "dual_thousandth_ratio", "dual_ten_thousandth_ratio", "binary_error_rate", "error_balance", "rmse",
    "small_value_err_ratio", "max_rel_err", "mean_rel_err", "inf_nan_err_ratio", "rel_err_ratio", "abs_err_ratio",
    "max_ulp_err", "mean_ulp_err", "ulp_err_proportion", "status", "message",
]


def metrics(**values: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    unknown = set(values) - set(out)
    assert not unknown, unknown
    out.update(values)
    return out


def output(name: str, status: str = "pass", device_dtype: str = "torch.float32", shape: list[int] | None = None,
           bench_dtype: str | None = None, message: str = "", worst: dict | None = None, **values: Any) -> Row:
    if bench_dtype is None:
        bench_dtype = "torch.float64" if device_dtype == "torch.float32" else "torch.float32"
    return Row(name=name, status=status, message=message, bench_dtype=bench_dtype, device_dtype=device_dtype,
               shape=[4, 8] if shape is None else shape, metrics=metrics(**values), worst=worst)


def record(api: str, direction: str = "forward", status: str = "pass", outputs: list[Row] | None = None,
           message: str = "", seed: int = 1234) -> Record:
    rec = Record.from_dict({"nodeid": f"d/dump.json::{api}.{direction}", "dump": "d/dump.json", "api": api,
                            "direction": direction, "status": status, "message": message, "seed": seed,
                            "device": "cpu", "standard": "original"})
    rec.outputs = [] if outputs is None else outputs
    return rec


# ------------------------------------------------------------------------------------------------ headers


def test_headers_are_msprobes() -> None:
    assert list(DETAILS_HEADER) == A12_DETAILS
    assert RESULT_HEADER == ("API name", "Forward Test Success", "Backward Test Success", "Message")


def test_metric_keys_line_up_with_metric_columns() -> None:
    # METRIC_KEYS shortens "dual_*_ratio" to "dual_*"; otherwise the same names in the same order.
    english = [e.replace("_ratio", "") if e.startswith("dual_") else e for e in A12_ENGLISH[4:21]]
    assert list(METRIC_KEYS) == english


def test_timestamp_format() -> None:
    assert re.fullmatch(r"\d{14}", timestamp())


# ------------------------------------------------------------------------------------------------ result rows


def test_api_results_pairs_directions_in_first_seen_order() -> None:
    recs = [
        record("Torch.matmul.3", "backward", "Warning"),
        record("Functional.linear.0", "forward", "pass"),
        record("Torch.matmul.3", "forward", "error"),
        record("Functional.linear.0", "backward", "pass"),
        record("Torch.sum.0", "forward", "Warning"),
        record("Torch.max.1", "backward", "pass"),
    ]
    assert api_results(recs) == [
        ("Torch.matmul.3", "error", "Warning", None),
        ("Functional.linear.0", "pass", "pass", None),
        ("Torch.sum.0", "Warning", " ", None),
        ("Torch.max.1", " ", "pass", None),
    ]


def test_api_results_message_cell_only_for_skip() -> None:
    recs = [
        record("VF.lstm.0", "forward", "SKIP", message="Unsupported API"),
        record("Torch.add.0", "forward", "error", message="RuntimeError: boom"),
        record("Torch.add_.0", "forward", "pass"),
        record("Torch.add_.0", "backward", "SKIP", message="out= / inplace: backward not checked"),
        # message falls back to the first output's message (msprobe uses the first details row's)
        record("Torch.nonzero.0", "forward", "SKIP",
               outputs=[output("Torch.nonzero.0.forward.output.0", "SKIP", message="Bench output is None")]),
    ]
    assert api_results(recs) == [
        ("VF.lstm.0", "SKIP", " ", "Unsupported API"),
        ("Torch.add.0", "error", " ", None),
        ("Torch.add_.0", "pass", "SKIP", "out= / inplace: backward not checked"),
        ("Torch.nonzero.0", "SKIP", " ", "Bench output is None"),
    ]


# ------------------------------------------------------------------------------------------------ details rows


def test_details_row_formatting() -> None:
    out = output("Functional.linear.0.forward.output.0", "Warning", "torch.bfloat16", [4, 32],
                 message="Relative error is greater than 0.001, consider as warning",
                 cosine=0.99999, max_abs_err=1e-7, dual_hundredth=1.0, dual_thousandth=0.5, error_balance=-2.5e-5,
                 max_ulp_err=3, mean_rel_err=float("nan"), max_rel_err=float("inf"))
    (row,) = details_rows([record("Functional.linear.0", outputs=[out])])
    assert len(row) == 23
    cells = dict(zip(A12_ENGLISH, row))
    assert cells["api_name"] == "Functional.linear.0.forward.output.0"
    assert cells["bench_dtype"] == "torch.float32"
    assert cells["device_dtype"] == "torch.bfloat16"
    assert cells["shape"] == "(4, 32)"
    assert cells["cosine"] == "0.99999000000000"
    assert cells["max_abs_err"] == "0.00000010000000"
    assert cells["dual_thousandth_ratio"] == "0.50000000000000"
    assert cells["error_balance"] == "-0.00002500000000"
    assert cells["max_ulp_err"] == "3"                      # ints are written as ints, like msprobe
    assert cells["mean_rel_err"] == "nan"
    assert cells["max_rel_err"] == "inf"
    assert cells["dual_ten_thousandth_ratio"] == " "        # None -> single space
    assert cells["rmse"] == " "
    assert cells["status"] == "Warning"
    assert cells["message"].startswith("Relative error is greater")


@pytest.mark.parametrize("shape, text", [([4, 32], "(4, 32)"), ([7], "(7,)"), ([], "()"), ([0], "(0,)"),
                                         (None, " ")])
def test_details_shape_cell(shape: list[int] | None, text: str) -> None:
    out = output("Torch.sum.0.forward.output.0", shape=[1])
    out.shape = shape
    assert details_rows([record("Torch.sum.0", outputs=[out])])[0][3] == text


def test_details_precision_parameter() -> None:
    out = output("Torch.sum.0.forward.output.0", cosine=0.123456789)
    assert details_rows([record("Torch.sum.0", outputs=[out])], precision=3)[0][4] == "0.123"
    assert details_rows([record("Torch.sum.0", outputs=[out])])[0][4] == "0.12345678900000"


def test_details_item_without_outputs_gets_one_row() -> None:
    rows = details_rows([
        record("VF.lstm.0", "forward", "SKIP", message="Unsupported API VF.lstm"),
        record("Torch.mm.2", "backward", "error", message="RuntimeError: shape mismatch"),
    ])
    assert rows[0] == ["VF.lstm.0.forward.output.0"] + [" "] * 20 + ["SKIP", "Unsupported API VF.lstm"]
    assert rows[1][0] == "Torch.mm.2.backward.output.0"
    assert rows[1][-2:] == ["error", "RuntimeError: shape mismatch"]
    assert all(len(r) == 23 for r in rows)


def test_details_one_row_per_output_in_order() -> None:
    recs = [
        record("Torch.max.0", outputs=[output("Torch.max.0.forward.output.0"),
                                       output("Torch.max.0.forward.output.1", device_dtype="torch.int64")]),
        record("Torch.max.0", "backward", outputs=[output("Torch.max.0.backward.output.0")]),
    ]
    assert [r[0] for r in details_rows(recs)] == [
        "Torch.max.0.forward.output.0", "Torch.max.0.forward.output.1", "Torch.max.0.backward.output.0"]


# ------------------------------------------------------------------------------------------------ files


def sample_records() -> list[Record]:
    bench = dict(small_value_err_ratio=0.0, rmse=0.0031, max_rel_err=0.0078, mean_rel_err=0.0011, error_balance=1e-5)
    return [
        record("NPU.npu_rms_norm.0", outputs=[
            output("NPU.npu_rms_norm.0.forward.output.0", device_dtype="torch.bfloat16", shape=[2, 8],
                   cosine=0.99999, max_abs_err=0.01, **bench),
            output("NPU.npu_rms_norm.0.forward.output.1", shape=[2, 1], cosine=1.0, max_abs_err=1e-7, **bench)]),
        record("NPU.npu_rms_norm.0", "backward", "Warning", outputs=[
            output("NPU.npu_rms_norm.0.backward.output.0", "Warning", "torch.bfloat16", [2, 8],
                   cosine=0.9999, max_abs_err=0.01, **bench)]),
        record("Torch.matmul.3", outputs=[
            output("Torch.matmul.3.forward.output.0", device_dtype="torch.float16", shape=[4, 4], cosine=1.0,
                   max_abs_err=0.0004, max_ulp_err=1.0, mean_ulp_err=0.1, ulp_err_proportion=0.0)]),
        record("Tensor.add.1", status="Warning", outputs=[
            output("Tensor.add.1.forward.output.0", "Warning", "torch.bfloat16", [16], cosine=1.0,
                   max_abs_err=0.002, dual_hundredth=1.0, dual_thousandth=0.4375, inf_nan_err_ratio=0.0,
                   rel_err_ratio=0.0, abs_err_ratio=0.0)]),
        record("Torch.argmax.0", outputs=[
            output("Torch.argmax.0.forward.output.0", device_dtype="torch.int64", bench_dtype="torch.int64",
                   shape=[], binary_error_rate=0.0)]),
        record("VF.lstm.0", status="SKIP", message="Unsupported API VF.lstm, 不支持"),
        record("Functional.conv2d.0", status="error", message='RuntimeError: "boom",\nsecond line'),
    ]


def read_csv_rows(path: Path) -> list[list[str]]:
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf"), "msprobe CSVs carry a UTF-8 BOM"
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.reader(f))


def test_write_results_files(tmp_path: Path) -> None:
    recs = sample_records()
    out_dir = tmp_path / "a" / "b"
    paths = write_results(recs, out_dir, ts="20240102030405")
    assert paths == {"result": out_dir / "accuracy_checking_result_20240102030405.csv",
                     "details": out_dir / "accuracy_checking_details_20240102030405.csv",
                     "jsonl": out_dir / "msprobe_records_20240102030405.jsonl"}

    result = read_csv_rows(paths["result"])
    assert result[0] == list(RESULT_HEADER)
    assert result[1:] == [
        ["NPU.npu_rms_norm.0", "pass", "Warning"],
        ["Torch.matmul.3", "pass", " "],
        ["Tensor.add.1", "Warning", " "],
        ["Torch.argmax.0", "pass", " "],
        ["VF.lstm.0", "SKIP", " ", "Unsupported API VF.lstm, 不支持"],
        ["Functional.conv2d.0", "error", " "],
    ]

    details = read_csv_rows(paths["details"])
    assert details[0] == A12_DETAILS
    assert details[1:] == details_rows(recs)          # quoting of commas/newlines round-trips
    assert details[-1][-1] == 'RuntimeError: "boom",\nsecond line'

    assert read_records(paths["jsonl"]) == recs
    # the archive holds each record's plain form, one line each, as json.dumps writes it
    assert paths["jsonl"].read_bytes().decode("utf-8") == "".join(
        json.dumps(rec.to_dict(), ensure_ascii=False, allow_nan=True) + "\n" for rec in recs)
    assert [rec.to_dict() for rec in read_records(paths["jsonl"])] == [rec.to_dict() for rec in recs]


def test_write_results_default_timestamp_shared(tmp_path: Path) -> None:
    paths = write_results([record("Torch.sum.0")], tmp_path)
    stamps = {re.search(r"_(\d{14})\.", p.name).group(1) for p in paths.values()}  # type: ignore[union-attr]
    assert len(stamps) == 1
    assert re.fullmatch(r"accuracy_checking_result_\d{14}\.csv", paths["result"].name)  # msprobe resume regex


def test_write_results_empty(tmp_path: Path) -> None:
    paths = write_results([], tmp_path, ts="20240102030405")
    assert read_csv_rows(paths["result"]) == [list(RESULT_HEADER)]
    assert read_csv_rows(paths["details"]) == [A12_DETAILS]
    assert read_records(paths["jsonl"]) == []


def test_jsonl_keeps_nan_and_inf(tmp_path: Path) -> None:
    rec = record("Torch.sum.0", outputs=[output("Torch.sum.0.forward.output.0", cosine=float("nan"),
                                                max_rel_err=float("inf"))])
    paths = write_results([rec], tmp_path, ts="20240102030405")
    (back,) = read_records(paths["jsonl"])
    assert math.isnan(back.outputs[0].metrics["cosine"])
    assert back.outputs[0].metrics["max_rel_err"] == math.inf


# ------------------------------------------------------------------------------------------------ read_jsonl


def test_read_jsonl_drops_truncated_last_line(tmp_path: Path) -> None:
    good = [record("Torch.sum.0"), record("Torch.sum.1", message="ünïcode")]
    lines = [json.dumps(r.to_dict(), ensure_ascii=False).encode() for r in good]
    path = tmp_path / "r.jsonl"
    for partial in (lines[1][:20], lines[1][: lines[1].index("ü".encode()) + 1]):   # mid-JSON, mid-UTF-8
        path.write_bytes(lines[0] + b"\n" + partial)
        assert read_records(path) == good[:1]
        assert read_jsonl(path) == [r.to_dict() for r in good[:1]]
    path.write_bytes(lines[0] + b"\n" + lines[1])                     # complete line without final newline
    assert read_records(path) == good
    path.write_bytes(lines[0] + b"\n\n" + lines[1] + b"\n\n\n")       # blank lines are ignored
    assert read_records(path) == good
    assert read_jsonl(path) == [r.to_dict() for r in good]
    path.write_bytes(b"")
    assert read_records(path) == []
    assert read_jsonl(path) == []


def test_read_jsonl_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl:2"):
        read_jsonl(path)
    with pytest.raises(ValueError, match=r"r\.jsonl:2"):
        read_records(path)


def test_read_records_names_the_line_that_is_not_a_record(tmp_path: Path) -> None:
    """A line that is JSON but not a record (an unknown key, a missing one, not an object) is one error line naming
    the file and the line, also when it is the last one: only a cut-off line is taken for a killed run's."""
    good = json.dumps(record("Torch.sum.0").to_dict())
    path = tmp_path / "r.jsonl"
    for bad, why in (({**record("Torch.sum.1").to_dict(), "duration_s": 0.01}, "no field 'duration_s'"),
                     ({"api": "Torch.sum.1", "direction": "forward"}, "without 'seed'"),
                     ([1, 2], "a JSON list, not an object")):
        for text in (f"{good}\n{json.dumps(bad)}\n{good}\n", f"{good}\n\n{json.dumps(bad)}"):
            path.write_text(text)
            line = 2 if text.count("\n") == 3 else 3
            with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:{line}: not a record: .*{re.escape(why)}"):
                read_records(path)


# ------------------------------------------------------------------------------------------------ text


def test_format_failure_table() -> None:
    rec = record("Functional.linear.0", status="error", seed=42, message="1 of 2 outputs failed", outputs=[
        output("Functional.linear.0.forward.output.0", "error", "torch.float16", [4, 32],
               message="Cosine similarity is less than 0.99",
               cosine=0.981234567, max_abs_err=0.1234567, max_rel_err=12345678.9,
               worst={"index": [1, 3], "device": 0.5, "bench": 0.50001, "abs_err": 1e-5, "rel_err": 2e-5}),
        output("Functional.linear.0.forward.output.1", "pass", shape=[], cosine=None, max_abs_err=0.0),
    ])
    rec.outputs.reverse()  # the worst output is listed first whatever its position
    rerun = "pytest 'd/dump.json::Functional.linear.0.forward' --msprobe-seed=42"
    text = format_failure(rec, rerun)
    assert "\x1b" not in text
    lines = text.splitlines()
    # first the digest pytest's short summary shows: the verdict and the worst output's reason
    assert lines[0] == "error: output.0: Cosine similarity is less than 0.99"
    assert lines[1].startswith("Functional.linear.0.forward: error")
    header, row0, row1 = lines[2:5]
    assert header.split() == ["output", "shape", "device", "bench", "verdict", "cosine", "max_abs_err",
                              "max_rel_err", "worst_idx", "worst_device", "worst_bench"]
    assert row0.startswith("output.0 ") and row1.startswith("output.1 ")
    assert "(4, 32)" in row0 and "float16" in row0 and "float32" in row0
    for number in ("0.981235", "0.123457", "1.23457e+07", "[1, 3]", "0.5", "0.50001"):
        assert number in row0
    assert "()" in row1 and "float64" in row1
    # aligned: every column starts at the same offset in header and rows
    for col in ("verdict", "cosine", "max_rel_err", "worst_idx"):
        start = header.index(col)
        assert row0[start - 1] == " " and row0[start] != " "
        assert row1[start - 1] == " " and row1[start] != " "
    assert "output.0: Cosine similarity is less than 0.99" in text
    assert "message: 1 of 2 outputs failed" in lines
    assert lines[-2:] == ["item seed: 42 (this call's inputs, derived from the run seed and the API name)",
                         f"rerun: {rerun}"]


def test_format_failure_without_outputs() -> None:
    rec = record("Torch.mm.2", "backward", "error", message="Traceback:\n  RuntimeError: boom", seed=7)
    text = format_failure(rec, "pytest x")
    assert text.splitlines() == ["error: Traceback: RuntimeError: boom",
                                 "Torch.mm.2.backward: error  (device=cpu, standard=original)",
                                 "message: Traceback:", "      RuntimeError: boom",
                                 "item seed: 7 (this call's inputs, derived from the run seed and the API name)",
                                 "rerun: pytest x"]


def test_the_item_seed_is_printed_only_where_it_drew_the_inputs() -> None:
    """Saved tensors (`data: real`, replay or a tensor dump) need no seed; drawn inputs, or a record that does not
    say (a crash before its inputs were built), may."""
    seed_line = "item seed: 7 (this call's inputs, derived from the run seed and the API name)"
    for data, printed in (("real", False), ("random", True), (None, True)):
        rec = record("Torch.mm.2", status="error", message="boom", seed=7)
        if data is not None:
            rec.data = data
        assert (seed_line in format_failure(rec, "pytest x").splitlines()) is printed, data


def test_the_failure_digest_is_one_short_line_of_the_first_reason() -> None:
    long_reason = "gross error: " + "x " * 200
    out = output("Functional.gelu.0.forward.output.0", "Warning", message="Relative error is greater than 0.0001")
    out.verdict, out.verdict_message = "error", long_reason
    rec = record("Functional.gelu.0", status="error", outputs=[out])
    digest = failure_digest(rec)
    assert digest is not None and "\n" not in digest and len(digest) <= DIGEST_LIMIT
    assert digest.startswith("error: output.0: gross error: x x") and digest.endswith("…")
    assert "Layer 1" not in digest  # the selected standard's reason, not every reason the table lists
    assert failure_digest(record("Functional.gelu.0", status="pass")) is None


def test_failure_text_keeps_the_digest_above_a_traceback() -> None:
    from pytest_msprobe.session.items import failure_text

    rec = record("Torch.mm.2", status="error", message="device run raised RuntimeError: boom")
    rec.traceback = "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n"
    lines = failure_text(rec, "pytest x").splitlines()
    assert lines[0] == "error: device run raised RuntimeError: boom"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[lines.index("RuntimeError: boom") + 2].startswith("Torch.mm.2.forward: error")


def test_details_statuses_count_the_csv_rows_of_pytorch_records() -> None:
    recs = [record("Torch.a.0", status="error", outputs=[output("Torch.a.0.forward.output.0", "Warning"),
                                                          output("Torch.a.0.forward.output.1", "pass")]),
            record("Torch.b.0", status="SKIP", message="no such API"),  # one row with the item's status
            record("Mint.c.0", status="error", outputs=[output("Mint.c.0.forward.output.0", "error")])]
    recs[2].framework = "mindspore"  # MindSpore's files carry the selected standard's verdict
    recs[0].layer1_status = "Warning"
    assert details_statuses(recs) == {"Warning": 1, "pass": 1, "SKIP": 1}
    cells = [row[-2] for row in details_rows(recs[:2])]
    assert sorted(cells) == sorted(s for s, n in details_statuses(recs).items() for _ in range(n))


def test_summary_counts() -> None:
    recs = [record("a", status=s) for s in ("pass", "pass", "Warning", "error", "SKIP", "SKIP", "SKIP")]
    assert summary_counts(recs) == {"pass": 2, "Warning": 1, "error": 1, "SKIP": 3}
    assert summary_counts([]) == {"pass": 0, "Warning": 0, "error": 0, "SKIP": 0}


# ------------------------------------------------------------------------------------------------ msprobe itself

# Runs msprobe 8.x's own api_precision_compare on our details CSV (given as both NPU and GPU file).
# It is run in a child process: importing msprobe pulls in torch, matplotlib and tensorboard and
# reconfigures logging, none of which should leak into this test session. msprobe 8.3.3 still uses
# np.unicode_ (removed in NumPy 2), so the child restores that alias before importing it.
_COMPARE_SCRIPT = textwrap.dedent("""
    import argparse, sys
    import numpy as np
    if not hasattr(np, "unicode_"):
        np.unicode_ = np.str_
    try:
        from msprobe.pytorch.api_accuracy_checker.compare.api_precision_compare import (
            _api_precision_compare_command)
    except Exception as exc:  # installed but unusable (missing optional dependency ...)
        print(f"IMPORT-FAILED {type(exc).__name__}: {exc}")
        sys.exit(3)
    _api_precision_compare_command(argparse.Namespace(
        npu_csv_path=sys.argv[1], gpu_csv_path=sys.argv[1], out_path=sys.argv[2]))
""")


def test_msprobe_api_precision_compare_reads_our_details(tmp_path: Path) -> None:
    if importlib.util.find_spec("msprobe") is None:
        pytest.skip("msprobe (pip package mindstudio-probe) is not installed; msprobe compatibility not checked")
    recs = sample_records()
    paths = write_results(recs, tmp_path / "run", ts="20240102030405")
    out_dir = tmp_path / "compare"
    proc = subprocess.run([sys.executable, "-c", _COMPARE_SCRIPT, str(paths["details"]), str(out_dir)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    log = proc.stdout + proc.stderr
    if proc.returncode == 3 and "IMPORT-FAILED" in log:
        pytest.skip(f"msprobe is installed but not importable: {log.strip().splitlines()[-1]}")
    assert proc.returncode == 0, log
    for bad in ("Analyse csv Error", "Get api status error", "is invalid", "does not exist in the GPU data"):
        assert bad not in log, log

    (result_csv,) = out_dir.glob("api_precision_compare_result_*.csv")
    (details_csv,) = out_dir.glob("api_precision_compare_details_*.csv")
    result = read_csv_rows(result_csv)
    assert result[0] == ["API Name", "Forward Test Success", "Backward Test Success", "Message"]
    by_api = {row[0]: row[1:] for row in result[1:]}
    assert list(by_api) == [api for api, *_ in api_results(recs)]
    # Self-comparison: every checked metric ratio is <= 1, so everything that is compared passes;
    # items without outputs (blank DEVICE Dtype) are SKIPped with our message.
    assert by_api["NPU.npu_rms_norm.0"][:2] == ["pass", "pass"]
    assert by_api["Torch.matmul.3"][0] == "pass"
    assert by_api["Tensor.add.1"][0] == "pass"
    assert by_api["Torch.argmax.0"][0] == "pass"
    assert by_api["VF.lstm.0"][0] == "SKIP" and "Unsupported API VF.lstm" in by_api["VF.lstm.0"][2]
    assert by_api["Functional.conv2d.0"][0] == "SKIP"

    details = read_csv_rows(details_csv)
    algorithm = {row[0]: row[details[0].index("比对算法")] for row in details[1:]}
    assert algorithm == {
        "NPU.npu_rms_norm.0.forward.output.0": "标杆比对法",      # benchmark (default category)
        "NPU.npu_rms_norm.0.forward.output.1": "标杆比对法",
        "NPU.npu_rms_norm.0.backward.output.0": "标杆比对法",
        "Torch.matmul.3.forward.output.0": "ULP误差比对法",
        "Tensor.add.1.forward.output.0": "绝对阈值法",
        "Torch.argmax.0.forward.output.0": "二进制一致法",         # int64 device dtype
        "VF.lstm.0.forward.output.0": " ",
        "Functional.conv2d.0.forward.output.0": " ",
    }
