"""From red to fix, end to end: a planted failing API goes from a red item to everything needed to fix it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import by_api, make_dump, records
from tests.test_html import parse
from tests.triage_helpers import PLANTED, assert_same_numbers, gelu_bf16, relu_fp16, run_script, site_dir

LEAN = ("-p", "no:cacheprovider")


def test_a_planted_failing_api_goes_from_red_item_to_fix(pytester: pytest.Pytester) -> None:
    # gelu is wrong on the bf16 device (forward and gradient); relu only for fp16 inputs just below Max
    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, {**gelu_bf16(), **relu_fp16()})
    result = pytester.runpytest(str(dump), "--msprobe-standard", "strict", "--msprobe-save-error-data", "err",
                                "--msprobe-repro", "rep", "--msprobe-fuzz", "40", "--msprobe-html", "report.html",
                                *LEAN)

    # 1. the items fail (relu's own item passes: its inputs from the statistics miss the bug)
    result.assert_outcomes(failed=4, passed=1)
    result.stdout.fnmatch_lines(["FAILED d/dump.json::Functional.gelu.0.forward - *",
                                 "FAILED d/dump.json::Functional.gelu.0.forward[[]fuzz[]] - *",
                                 "FAILED d/dump.json::Functional.gelu.0.backward - *",
                                 "FAILED d/dump.json::Functional.relu.0.forward[[]fuzz[]] - *"])
    first = by_api(records(pytester))
    assert first["Functional.relu.0.forward"]["status"] == "pass"
    gelu = [first["Functional.gelu.0.forward"], first["Functional.gelu.0.backward"]]
    assert all(r["status"] == "error" and r["error_data"] and r["repro"] for r in gelu)

    # 2. the saved data is a dump: replayed, it fails the same way (same metrics, verdicts, worst elements)
    err = pytester.path / "err"
    assert json.loads((err / "dump.json").read_text())["task"] == "tensor"
    assert sorted(json.loads((err / "fuzz" / "dump.json").read_text())["data"]) == [
        "Functional.gelu.0.forward", "Functional.relu.0.forward"]  # the shrunk fuzz examples
    replay = pytester.runpytest(str(err), "--msprobe-standard", "strict", "--msprobe-out", "replay", *LEAN)
    replay.assert_outcomes(failed=4)
    again = {(r["dump"], r["api"], r["direction"]): r for r in records(pytester, "replay")}
    for old in gelu:
        new = again[("err/dump.json", old["api"], old["direction"])]
        assert new["data"] == "real"
        assert [o["metrics"] for o in new["outputs"]] == [o["metrics"] for o in old["outputs"]]
        assert [o["reference"] for o in new["outputs"]] == [o["reference"] for o in old["outputs"]]
    relu_example = again[("err/fuzz/dump.json", "Functional.relu.0", "forward")]
    assert relu_example["status"] == "error" and relu_example["outputs"][0]["worst"]["bench"] == 2.998046875

    # 3. the repro scripts, outside pytest and without pytest_msprobe, print the same numbers
    planted = site_dir(pytester.path)
    for record in gelu:
        rc, out = run_script(Path(record["repro"]), planted, "--json")
        assert rc == 1 and assert_same_numbers(out, record) >= 15
    fuzz_script = re.search(r"repro: python (\S+relu\.0\.forward_fuzz\.py)", result.stdout.str()).group(1)
    rc, out = run_script(Path(fuzz_script), planted, "--json")
    assert rc == 1 and out["same_as_item"] and out["status"] == "error"
    rc, text = run_script(Path(fuzz_script), site_dir(pytester.path, planted=False))
    assert rc == 0 and "verdict: pass" in text  # with a correct relu the shrunk example passes: the fix is verified

    # 4. fuzzing found the edge bug and shrank it to one element, one ULP below the recorded Max
    text = result.stdout.str()
    assert re.search(r"Functional\.relu\.0\.forward\[fuzz\]  seed \d+: input_args\.0 float16\[4, 4\]: every element 0, "
                     r"contiguous; \[\d, \d\] = 2\.998046875 \(one ULP below the recorded Max\)", text), text

    # 5. the HTML page shows it: the table row, the shrunk example, the plots of where the error is
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    rows = {r["item"]: r for r in parse(page).rows}
    assert rows["Functional.relu.0.forward [fuzz]"]["row_status"] == "error"
    assert rows["Functional.gelu.0.forward"]["row_status"] == "error"
    assert rows["Functional.relu.0.forward"]["row_status"] == "pass"
    assert "2.998046875 (one ULP below the recorded Max)" in page
    assert page.count('<svg class="plot heatmap"') == 4 and "<script src" not in page
