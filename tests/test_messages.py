"""What a user reads: one row per dump and call, bad JSON as one line, the reasons behind
WARNED and fallback verdicts, and small promises of the README."""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    EXAMPLES,
    ROOT,
    device_side_conftest,
    make_dump,
    records,
    tensor,
    two_ranks_same_names,
)

LEAN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def unary(dtype: str = "torch.float32", shape: list[int] | None = None, **kw: Any) -> dict[str, Any]:
    return {"input_args": [tensor(dtype, shape, **kw)], "input_kwargs": {}, "output": [tensor(dtype, shape)]}


def csv_rows(path: Path) -> list[list[str]]:
    return list(csv.reader(path.open(encoding="utf-8-sig")))


# --------------------------------------------------------------------------- 4. same API names in several dumps


def test_same_api_names_in_two_dumps_keep_one_row_per_dump_and_call(pytester: pytest.Pytester) -> None:
    two_ranks_same_names(pytester)  # gelu fails in rank1 only
    result = pytester.runpytest("step0", *LEAN)
    result.assert_outcomes(failed=1, passed=3)
    out = pytester.path / "msprobe_results"
    for rank, gelu in (("rank0", "pass"), ("rank1", "error")):
        (result_csv,) = out.glob(f"accuracy_checking_result_*_{rank}.csv")
        assert csv_rows(result_csv)[1:] == [["Functional.gelu.0", gelu, " "], ["Functional.relu.0", "pass", " "]]
        (details_csv,) = out.glob(f"accuracy_checking_details_*_{rank}.csv")
        assert [r[0] for r in csv_rows(details_csv)[1:]] == ["Functional.gelu.0.forward.output.0",
                                                            "Functional.relu.0.forward.output.0"]
    assert not list(out.glob("accuracy_checking_result_??????????????.csv"))  # no ambiguous merged file
    assert len(records(pytester)) == 4  # the JSON lines keep every record, with its dump
    result.stdout.fnmatch_lines(["worst failures (1 of 1):", "  step0/rank1/dump.json::Functional.gelu.0.forward *"])


# --------------------------------------------------------------------------- 5. bad JSON that is valid JSON


def test_a_statistic_beyond_float64_is_a_specific_skip(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, {"Functional.relu.0.forward": unary()})
    text = dump.read_text()
    dump.write_text(text.replace('"Max": 1.0', '"Max": 1' + "0" * 400, 1))  # 10**400, an integer
    result = pytester.runpytest(str(dump), "-rs", *LEAN)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*input_args.0: statistic Max=1000000000*(401 digits) is beyond float64*"])
    assert "OverflowError" not in result.stdout.str() and len(result.outlines) < 40


def test_a_deeply_nested_array_is_one_collection_error_line(pytester: pytest.Pytester) -> None:
    folder = pytester.mkdir("deep")
    depth = 100_000
    (folder / "dump.json").write_text('{"data": {"Functional.relu.0.forward": {"input_args": '
                                      + "[" * depth + "]" * depth + "}}}")
    result = pytester.runpytest("deep", *LEAN)
    result.assert_outcomes(errors=1)
    text = result.stdout.str()
    assert "RecursionError" not in text and "Traceback" not in text and len(result.outlines) < 30, text
    result.stdout.fnmatch_lines(["*deep/dump.json: arrays or objects nested deeper than * levels*"])
    # shallow enough for the parser, far too deep for an argument: the item's specific skip
    (folder / "dump.json").write_text('{"data": {"Functional.relu.0.forward": {"input_kwargs": {}, "input_args": '
                                      + "[" * 900 + "]" * 900 + "}}}")
    result = pytester.runpytest("deep", "-rs", "-o", "msprobe_allow_all_skipped=true", *LEAN)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*input_args: arguments nested more than 64 levels deep"])


# --------------------------------------------------------------------------- 7. reasons the terminal hid


def test_warned_items_show_their_reason_with_rA(pytester: pytest.Pytester) -> None:
    data = {"Tensor.add.0.forward": {"input_args": [tensor("torch.bfloat16", [64, 64], mx=8.0, mn=1.0)] * 2,
                                     "input_kwargs": {}, "output": [tensor("torch.bfloat16", [64, 64])]}}
    dump = make_dump(pytester, data)
    result = pytester.runpytest(str(dump), "--msprobe-standard", "original", "-rA", *LEAN)
    assert result.parseoutcomes()["warned"] == 1
    result.stdout.fnmatch_lines([("WARNED d/dump.json::Tensor.add.0.forward - output.0: Relative error is greater "
                                  "than 0.001, consider as warning*")])


def test_nan_statistics_failure_names_the_planted_nan(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, {"Functional.gelu.0.forward": unary(mx=float("nan"))})
    # msprobe's Layer 1 fails a NaN output (strict passes it: the NaN sits where the bench has it)
    result = pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", *LEAN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["Functional.gelu.0.forward: error*",
                                 "note: input_args.0: statistics contain NaN;*NaN planted at flat index 16",
                                 "cause: the recorded statistics hold NaN*"])


def test_fallback_verdict_says_which_original_check_failed(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(device_side_conftest("""
        import torch.nn.functional as F
        IMPLS = {F.scaled_dot_product_attention: lambda orig, *a, **k: orig(*a, **k) * 1.05}
    """))
    qkv = [tensor("torch.bfloat16", [1, 2, 16, 8], mx=2.0, mn=-2.0) for _ in range(3)]
    dump = make_dump(pytester, {"Functional.scaled_dot_product_attention.0.forward": {
        "input_args": qkv, "input_kwargs": {}, "output": [tensor("torch.bfloat16", [1, 2, 16, 8])]}})
    result = pytester.runpytest(str(dump), "--msprobe-standard", "msprobe", *LEAN)  # msprobe's Layer-1 fallback
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "output.0: benchmark needs a reference*: original standard applied",
        "output.0: original standard (Layer 1) error: Relative error is greater than 0.01, consider as error*"])


# --------------------------------------------------------------------------- 8. small things


def test_kernels_do_not_fuzz_the_apis_they_deselect(pytester: pytest.Pytester) -> None:
    pytest.importorskip("hypothesis")
    shutil.copytree(EXAMPLES / "approximate_kernel", pytester.path / "example")
    result = pytester.runpytest("example", "--collect-only", "-q", "--msprobe-fuzz", "2",
                                "--msprobe-kernels", "example/kernels.py:KERNELS", "-p", "no:cacheprovider")
    ids = [line for line in result.outlines if "::" in line]
    assert ids and all("Functional.softmax." in i for i in ids), ids
    assert sum(i.endswith("[fuzz]") for i in ids) == 2  # the two forward softmax calls


def test_repro_json_is_valid_json_with_nan_metrics(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES / "approximate_kernel", pytester.path / "example")
    result = pytester.runpytest("example", "--msprobe-device", "cpu", "--msprobe-repro", "rep", "-k",
                                "softmax and 1 and forward", "--msprobe-kernels", "example/kernels.py:KERNELS",
                                *LEAN)
    result.assert_outcomes(failed=1)
    (script,) = (pytester.path / "rep").glob("*.py")
    proc = subprocess.run([sys.executable, str(script), "--json"], capture_output=True, text=True, timeout=300,
                          cwd=script.parent, check=False)
    assert proc.returncode == 1, proc.stderr

    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    doc = json.loads(proc.stdout, parse_constant=no_constant)
    assert doc["outputs"][0]["metrics"]["cosine"] == "nan"  # written as a string, documented in the README


def test_readme_stands_on_its_own_and_its_commands_are_installed() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        assert not re.search(r"REFERENCE\s*§", page.read_text(encoding="utf-8")), page
    pyproject = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)\]", pyproject, re.MULTILINE | re.DOTALL)
    test_extra = re.search(r"^test = \[(.*?)\]", pyproject, re.MULTILINE)
    assert re.search(r"^pytest .* -n \d", readme, re.MULTILINE)  # "Using it" spreads over xdist workers ...
    assert deps and '"pytest-xdist' in deps.group(1)  # ... which the plain install (command 1) brings
    assert test_extra and '"pytest-html' in test_extra.group(1)  # its integration test runs in CI
