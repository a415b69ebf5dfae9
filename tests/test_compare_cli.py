"""`python -m pytest_msprobe compare --npu NPU.csv --gpu GPU.csv --out DIR`: msprobe's api_precision_compare
on two details CSVs, with the per-API verdicts of msprobe 8.3.3's own api_precision_compare (checked against
msprobe itself where it can be imported)."""
from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.__main__ import main
from pytest_msprobe.metrics.vectorised import METRIC_KEYS
from pytest_msprobe.reports.compare import CompareError, compare_files
from pytest_msprobe.reports.results import DETAILS_HEADER, details_rows
from pytest_msprobe.specs.loader import load_specs

SPECS = load_specs()
_COLUMN = dict(zip(METRIC_KEYS, DETAILS_HEADER[4:]))


def row(name: str, dtype: str = "torch.float32", shape: str = "(4, 8)", message: str = "", **metrics: Any) -> list:
    cells = {"API Name": name, "Bench Dtype": "torch.float64", "DEVICE Dtype": dtype, "Shape": shape,
             "Status": "pass", "Message": message}
    for key, value in metrics.items():
        cells[_COLUMN[key]] = f"{value:.14f}" if isinstance(value, float) else value
    return [cells.get(col, " ") for col in DETAILS_HEADER]


BENCH = {"small_value_err_ratio": 0.0, "rmse": 0.001, "max_rel_err": 0.01, "mean_rel_err": 0.001, "error_balance": 0.0}

# (NPU row, GPU row or None): every path of api_precision_compare's walk
CASES: list[tuple[list, list | None]] = [
    (row("Torch.matmul.0.forward.output.0", "torch.float16", mean_ulp_err=0.5, ulp_err_proportion=0.0005),
     row("Torch.matmul.0.forward.output.0", "torch.float16", mean_ulp_err=0.5, ulp_err_proportion=0.0001)),
    (row("Torch.matmul.1.forward.output.0", "torch.float16", mean_ulp_err=3.0, ulp_err_proportion=0.01),
     row("Torch.matmul.1.forward.output.0", "torch.float16", mean_ulp_err=1.0, ulp_err_proportion=0.001)),
    (row("Torch.matmul.2.forward.output.0", mean_ulp_err=70.0, ulp_err_proportion=0.1),
     row("Torch.matmul.2.forward.output.0", mean_ulp_err=60.0, ulp_err_proportion=0.2)),
    (row("NPU.npu_rms_norm.0.forward.output.0", "torch.bfloat16", **{**BENCH, "rmse": 0.004}),
     row("NPU.npu_rms_norm.0.forward.output.0", "torch.bfloat16", **BENCH)),
    (row("NPU.npu_rms_norm.0.forward.output.1", "torch.bfloat16", **{**BENCH, "small_value_err_ratio": 0.1}),
     row("NPU.npu_rms_norm.0.forward.output.1", "torch.bfloat16", **{**BENCH, "small_value_err_ratio": 0.01})),
    (row("NPU.npu_rms_norm.0.backward.output.0", "torch.bfloat16", **BENCH),
     row("NPU.npu_rms_norm.0.backward.output.0", "torch.bfloat16", **BENCH)),
    (row("Tensor.add.1.forward.output.0", "torch.bfloat16", inf_nan_err_ratio=0.0, rel_err_ratio=0.001,
         abs_err_ratio=0.0), None),
    (row("Tensor.add.2.forward.output.0", inf_nan_err_ratio=0.0, rel_err_ratio=0.0, abs_err_ratio=0.0), None),
    (row("Torch.argmax.0.forward.output.0", "torch.int64", binary_error_rate=0.0), None),
    (row("Torch.argmax.1.forward.output.0", "torch.int64", binary_error_rate=0.5), None),
    (row("Functional.conv2d.0.forward.output.0", dual_thousandth=0.9995), None),
    (row("Functional.conv2d.1.forward.output.0", dual_thousandth=0.99), None),
    (row("Torch.sum.0.forward.output.0", "torch.float64", cosine=1.0), None),
    # an error row, then an fp64 row: msprobe judges the API by its last row's dtype (SKIP)
    (row("Functional.linear.0.forward.output.0", mean_ulp_err=100.0, ulp_err_proportion=0.5),
     row("Functional.linear.0.forward.output.0", mean_ulp_err=1.0, ulp_err_proportion=0.01)),
    (row("Functional.linear.0.forward.output.1", "torch.float64"), None),
    (row("VF.lstm.0.forward.output.0", " ", message="Unsupported API VF.lstm"), None),
    (row("Torch.topk.0.forward.output.0", "torch.float16", binary_error_rate=0.25), None),  # a binary API
    (row("Torch.topk.0.forward.output.1", "torch.int64", binary_error_rate=0.0), None),
    (row("Torch.exp.0.forward.output.0", "torch.bfloat16", **{**BENCH, "rmse": " "}),  # a blank metric cell
     row("Torch.exp.0.forward.output.0", "torch.bfloat16", **BENCH)),
    (row("Torch.exp.0.forward.output.1", "torch.bfloat16", **BENCH),
     row("Torch.exp.0.forward.output.1", "torch.bfloat16", **BENCH)),
    (row("Torch.exp.1.forward.output.0", "torch.bfloat16", **{**BENCH, "rmse": "abc"}),  # not a number
     row("Torch.exp.1.forward.output.0", "torch.bfloat16", **BENCH)),
    (row("Torch.exp.2.forward.output.0", "torch.bfloat16", **{**BENCH, "rmse": "n/a"}),  # pandas: NaN
     row("Torch.exp.2.forward.output.0", "torch.bfloat16", **BENCH)),
    (row("Torch.not_on_gpu.0.forward.output.0", **BENCH), "absent"),
    (row("bad.name.forward.output", **BENCH), None),
    (row("Torch.empty_like_out.0.forward.output.0", shape="(0,)", **BENCH), None),
    (row("Torch.log.0.forward.output.0", **{**BENCH, "max_rel_err": "inf"}),
     row("Torch.log.0.forward.output.0", **{**BENCH, "max_rel_err": "inf"})),
    (row("Torch.log.1.forward.output.0", **{**BENCH, "max_rel_err": "nan"}),
     row("Torch.log.1.forward.output.0", **{**BENCH, "max_rel_err": 1.0})),
    (row("Torch.linalg.vector_norm.0.forward.output.0", **BENCH),
     row("Torch.linalg.vector_norm.0.forward.output.0", **BENCH)),
    (row("Functional.gelu.0.forward.output.0", **BENCH), row("Functional.gelu.0.forward.output.0", **BENCH)),
    (row("Functional.gelu.0.backward.output.0", " ", message="no gradient"), None),
]


def write_pair(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    npu, gpu = folder / "accuracy_checking_details_20240101000000.csv", folder / "gpu" / \
        "accuracy_checking_details_20240101000001.csv"
    gpu.parent.mkdir(exist_ok=True)
    for path, rows in ((npu, [n for n, _ in CASES]),
                       (gpu, [n if g is None else g for n, g in CASES if g != "absent"])):
        with open(path, "w", encoding="utf-8-sig", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(DETAILS_HEADER)
            writer.writerows(rows)
    return npu, gpu


def read(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.reader(fh))


def run_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict, dict, str]:
    npu, gpu = write_pair(tmp_path / "in")
    assert main(["compare", "--npu", str(npu), "--gpu", str(gpu), "--out", str(tmp_path / "out"), *extra]) == 0
    out = capsys.readouterr()
    (result,) = (tmp_path / "out").glob("api_precision_compare_result_*.csv")
    (details,) = (tmp_path / "out").glob("api_precision_compare_details_*.csv")
    results = {r[0]: r[1:] for r in read(result)[1:]}
    rows = read(details)
    return results, {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}, out.out + out.err


def test_the_compare_command_applies_api_precision_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, details, log = run_cli(tmp_path, capsys)
    assert results == {
        "Torch.matmul.0": ["pass", " ", ""],       # ULP fp16: proportion < 0.001
        "Torch.matmul.1": ["error", " ", ""],      # ratio 10
        "Torch.matmul.2": ["pass", " ", ""],       # fp32: ratio 0.5 < 1
        "NPU.npu_rms_norm.0": ["error", "pass", ""],  # small-value ratio 0.1 / max(0.01, 2**-8)
        "Tensor.add.1": ["error", " ", ""], "Tensor.add.2": ["pass", " ", ""],
        "Torch.argmax.0": ["pass", " ", ""], "Torch.argmax.1": ["error", " ", ""],
        "Functional.conv2d.0": ["pass", " ", ""], "Functional.conv2d.1": ["error", " ", ""],
        "Torch.sum.0": ["SKIP", "SKIP", "This data type does not support benchmark compare."],
        "Functional.linear.0": ["SKIP", "SKIP", "This data type does not support benchmark compare."],
        "VF.lstm.0": ["SKIP", " ", "Unsupported API VF.lstm"],
        "Torch.topk.0": ["error", " ", "在npu上，topk的入参sorted=False时不生效，会返回有序tensor，而cpu上会返回无序tensor。 "
                                       "如果topk精度不达标，请检查是否是该原因导致的。"],
        "Torch.exp.0.forward.output.0": ["SKIP", "SKIP", "ERROR: Input data is an empty string"],
        "Torch.exp.0": ["pass", " ", ""],
        "Torch.exp.1.forward.output.0": ["SKIP", "SKIP", "ERROR: Input data cannot be converted to float"],
        "Torch.exp.2": ["error", " ", ""],          # NaN (as pandas reads n/a) against a number
        "bad.name.forward.output": ["SKIP", "SKIP", "The API name bad.name.forward.output is invalid."],
        "Torch.empty_like_out.0": ["SKIP", " ", ""],
        "Torch.log.0": ["pass", " ", ""],          # inf on both sides: consistent
        "Torch.log.1": ["error", " ", ""],         # NaN against a number
        "Torch.linalg.vector_norm.0": ["pass", " ", ""],
        "Functional.gelu.0": ["pass", "SKIP", ""],
    }
    assert "Torch.not_on_gpu.0.forward.output.0 is not in the GPU file" in log
    assert "Torch.not_on_gpu.0.forward.output.0" not in details
    algorithms = {name: d["比对算法"] for name, d in details.items()}
    assert algorithms["Torch.matmul.0.forward.output.0"] == "ULP误差比对法"
    assert algorithms["NPU.npu_rms_norm.0.forward.output.1"] == "标杆比对法"
    assert algorithms["Tensor.add.1.forward.output.0"] == "绝对阈值法"
    assert algorithms["Torch.argmax.0.forward.output.0"] == "二进制一致法"
    assert algorithms["Functional.conv2d.1.forward.output.0"] == "双千指标法"
    small = details["NPU.npu_rms_norm.0.forward.output.1"]
    assert (float(small["小值域错误比值"]), small["小值域判定结果"]) == (0.1 / 0.01, "error")
    assert details["Torch.matmul.1.forward.output.0"]["ULP误差判定结果"] == "error"
    assert details["VF.lstm.0.forward.output.0"]["Message"] == "Unsupported API VF.lstm"
    assert "24 APIs; forward/backward verdicts:" in log


def test_our_own_details_csv_is_accepted(tmp_path: Path) -> None:
    from pytest_msprobe.reports.results import write_results
    from tests.test_report import sample_records

    paths = write_results(sample_records(), tmp_path / "run", ts="20240102030405")
    results, details, missing = compare_files(paths["details"], paths["details"], SPECS)
    assert not missing and len(details) == len(details_rows(sample_records()))
    assert {r[0]: r[1] for r in results}["Torch.matmul.3"] == "pass"  # against itself every ratio is <= 1


def test_bad_inputs_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    npu, gpu = write_pair(tmp_path / "in")
    ms = tmp_path / "ms.csv"
    ms.write_text("API Name,Bench Dtype,Tested Dtype,Shape,Cosine,MaxAbsErr,MaxRelativeErr,Status,Message\n")
    with pytest.raises(CompareError, match=r"--npu .*ms.csv: not an accuracy_checking_details CSV: missing column\(s\) "
                                           r"DEVICE Dtype.*\(a MindSpore checker CSV"):
        compare_files(ms, gpu, SPECS)
    twice = tmp_path / "twice.csv"
    twice.write_text(gpu.read_text(encoding="utf-8-sig") + gpu.read_text(encoding="utf-8-sig").split("\n", 1)[1],
                     encoding="utf-8")
    with pytest.raises(CompareError, match="Torch.matmul.0.forward.output.0 has 2 rows"):
        compare_files(npu, twice, SPECS)
    with pytest.raises(SystemExit, match="error: --gpu .*nothing.csv: cannot read"):
        main(["compare", "--npu", str(npu), "--gpu", str(tmp_path / "nothing.csv"), "--out", str(tmp_path / "o")])


def test_msprobe26_reads_blank_cells_as_zero_and_benchmarks_every_float(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    results, details, _ = run_cli(tmp_path, capsys, "--standard", "msprobe26")
    assert results["Torch.exp.0"] == ["pass", " ", ""] and "Torch.exp.0.forward.output.0" not in results
    assert details["Torch.matmul.0.forward.output.0"]["比对算法"] == "标杆比对法"


# ------------------------------------------------------------------------------------------------ msprobe itself

_MSPROBE = textwrap.dedent("""
    import argparse, sys
    import numpy as np
    if not hasattr(np, "unicode_"):
        np.unicode_ = np.str_
    try:
        from msprobe.pytorch.api_accuracy_checker.compare.api_precision_compare import (
            _api_precision_compare_command)
    except Exception as exc:
        print(f"IMPORT-FAILED {type(exc).__name__}: {exc}")
        sys.exit(3)
    _api_precision_compare_command(argparse.Namespace(npu_csv_path=sys.argv[1], gpu_csv_path=sys.argv[2],
                                                      out_path=sys.argv[3]))
""")


def test_same_per_api_verdicts_as_msprobes_own_api_precision_compare(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("msprobe") is None:
        pytest.skip("msprobe (pip package mindstudio-probe) is not installed; parity with msprobe not checked")
    npu, gpu = write_pair(tmp_path / "in")
    proc = subprocess.run([sys.executable, "-c", _MSPROBE, str(npu), str(gpu), str(tmp_path / "msprobe")],
                          capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    if proc.returncode == 3 and "IMPORT-FAILED" in proc.stdout:
        pytest.skip(f"msprobe is installed but not importable: {proc.stdout.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (theirs_csv,) = (tmp_path / "msprobe").glob("api_precision_compare_result_*.csv")
    (theirs_details,) = (tmp_path / "msprobe").glob("api_precision_compare_details_*.csv")
    theirs = [r[:3] for r in read(theirs_csv)[1:]]
    ours, details, _ = run_cli(tmp_path, capsys)
    assert theirs == [[api, *cells[:2]] for api, cells in ours.items()]  # same APIs, same order, same verdicts
    msprobe_rows = read(theirs_details)
    column = msprobe_rows[0].index("比对结果")
    assert {r[0]: r[column] for r in msprobe_rows[1:]} == {name: d["比对结果"] for name, d in details.items()}
    assert {v[0] for v in ours.values()} == {"pass", "error", "SKIP"}
