"""The standards end to end: strict on real dumps, three-way runs, reference results, planted bugs."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, SHARED_DUMPS, by_api, copy_dump, device_side_conftest, make_dump, records, tensor

BF16 = EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0"
FP32_TENSOR = EXAMPLES / "mlp_fp32_tensor" / "step0" / "rank0"


def as_dtype(pytester: pytest.Pytester, source: Path, dtype: str, name: str) -> Path:
    """The same statistics dump recorded in another float dtype (fp16 dumps are not in shared/)."""
    dump = copy_dump(pytester, source, name)
    dump.write_text(dump.read_text().replace('"torch.float32"', f'"{dtype}"').replace('"torch.bfloat16"', f'"{dtype}"'))
    return dump


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.float16", "torch.bfloat16"])
def test_strict_has_no_false_alarm_on_correct_cpu_kernels(pytester: pytest.Pytester, dtype: str) -> None:
    dumps = [str(as_dtype(pytester, BF16, dtype, "stats")), str(copy_dump(pytester, FP32_TENSOR, "tensor"))]
    if SHARED_DUMPS.is_dir():
        dumps.append(str(as_dtype(pytester, SHARED_DUMPS / "msprobe13_pt_statistics_mlp_fp32", dtype, "v13")))
    result = pytester.runpytest(*dumps, "--msprobe-standard", "strict", "--msprobe-device", "cpu")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 30, result.stdout.str()


def test_strict_catches_a_truncating_kernel_that_original_only_warns_about(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(device_side_conftest("""
        import torch
        import torch.nn.functional as F

        def gelu(orig, x, *a, **k):  # the device truncates instead of rounding
            exact = orig(x.float(), *a, **k)
            return (exact.view(torch.int32) & -65536).view(torch.float32).to(x.dtype)

        IMPLS = {F.gelu: gelu}
    """))
    data = {"Functional.gelu.0.forward": {"input_args": [tensor("torch.bfloat16", [64, 64], mx=3.0, mn=-3.0)],
                                          "input_kwargs": {}, "output": [tensor("torch.bfloat16", [64, 64])]}}
    dump = make_dump(pytester, data)
    result = pytester.runpytest(str(dump), "--msprobe-standard", "strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*biased towards zero*"])
    assert pytester.runpytest(str(dump), "--msprobe-standard", "original").ret == 0  # a Warning at most


def test_three_way_run_writes_api_precision_compare_files(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, FP32_TENSOR, "mlp")
    result = pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", "--msprobe-reference", "cpu",
                                "--msprobe-device", "cpu")
    assert result.ret == 0, result.stdout.str()
    recs = by_api(records(pytester))
    linear = recs["Functional.linear.0.forward"]["outputs"][0]
    assert linear["algorithm"] == "ulp_compare" and linear["verdict"] == "pass"
    assert linear["compare"]["ulp_err_proportion_ratio"] is not None
    gelu = recs["Functional.gelu.0.forward"]["outputs"][0]
    assert gelu["algorithm"] == "benchmark" and gelu["compare"]["rmse_status"] == "pass"
    out = pytester.path / "msprobe_results"
    (details,) = out.glob("api_precision_compare_details_*.csv")
    rows = list(csv.reader(details.open(encoding="utf-8-sig")))
    assert rows[0][0] == "API Name" and rows[0][-3:] == ["比对结果", "比对算法", "Message"] and len(rows[0]) == 28
    by_name = {r[0]: r for r in rows[1:]}
    assert by_name["Functional.linear.0.forward.output.0"][-2] == "ULP误差比对法"
    (result_csv,) = out.glob("api_precision_compare_result_*.csv")
    assert ["Functional.linear.0", "pass", "pass", ""] in list(csv.reader(result_csv.open(encoding="utf-8-sig")))


def test_without_reference_benchmark_apis_fall_back_to_layer1_and_say_so(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, FP32_TENSOR, "mlp")
    pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", "-k", "gelu and forward")
    (rec,) = records(pytester)
    assert rec["outputs"][0]["verdict"] == rec["outputs"][0]["status"]
    assert "needs a reference" in rec["outputs"][0]["verdict_message"]


def test_reference_results_from_an_earlier_run(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, FP32_TENSOR, "mlp")
    pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", "--msprobe-out", "gpu")
    (jsonl,) = (pytester.path / "gpu").glob("msprobe_records_*.jsonl")
    (details_csv,) = (pytester.path / "gpu").glob("accuracy_checking_details_*.csv")
    for reference in (jsonl, details_csv):
        out = f"npu_{reference.suffix[1:]}"
        result = pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", "-o",
                                    f"msprobe_reference_results={reference}", "--msprobe-out", out)
        assert result.ret == 0, result.stdout.str()
        gelu = by_api(records(pytester, out))["Functional.gelu.0.forward"]["outputs"][0]
        # same run, same numbers: the reference metrics read back are the item's own (CSV: 14 decimals)
        assert gelu["reference"]["rmse"] == pytest.approx(gelu["metrics"]["rmse"], abs=1e-14)
        assert gelu["compare"]["rmse_ratio"] <= 1.0 and gelu["verdict"] == "pass"


def test_reference_results_that_do_not_match_skip_with_the_reason(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, FP32_TENSOR, "mlp")
    pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", "--msprobe-out", "gpu")
    (details_csv,) = (pytester.path / "gpu").glob("accuracy_checking_details_*.csv")
    rows = list(csv.reader(details_csv.open(encoding="utf-8-sig")))
    rows = [r for r in rows if not r[0].startswith("Functional.linear.1.")]  # the GPU run lacked this API
    for r in rows:
        if r[0] == "Functional.gelu.0.forward.output.0":
            r[11] = "abc"  # 均方根误差
    broken = pytester.path / "broken.csv"
    with broken.open("w", encoding="utf-8-sig", newline="") as fh:
        csv.writer(fh).writerows(rows)
    result = pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", "-o", f"msprobe_reference_results={broken}",
                                "-rs", "-k", "gelu or linear")
    text = result.stdout.str()
    assert "no row Functional.linear.1.forward.output.0" in text
    assert "broken.csv:" in text and "column 均方根误差: 'abc' is not a number" in text
    assert "failed" not in result.parseoutcomes()


def test_msprobe26_judges_every_float_output_by_benchmark(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, FP32_TENSOR, "mlp")
    pytester.runpytest(str(dump), "--msprobe-standard", "msprobe26", "--msprobe-reference", "cpu", "-k", "linear")
    algorithms = {o["algorithm"] for r in records(pytester) for o in r["outputs"]}
    assert algorithms == {"benchmark"}


def test_user_specs_change_algorithm_and_skip(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, FP32_TENSOR, "mlp")
    pytester.makefile(".yaml", specs="apis:\n  gelu: {algorithm: thousandth_threshold}\n  "
                                     "layer_norm: {skip: 'known vendor issue'}\n")
    result = pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", "-o", "msprobe_specs=specs.yaml",
                                "-k", "gelu or layer_norm", "-rs")
    result.stdout.fnmatch_lines(["*known vendor issue (msprobe_specs)*"])
    gelu = by_api(records(pytester))["Functional.gelu.0.forward"]["outputs"][0]
    assert gelu["algorithm"] == "thousandth_threshold" and gelu["compare"]["thousandth_status"] == "pass"
