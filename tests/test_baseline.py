"""The baseline gate's own words: a listed item that passes now names the lines of the file to remove (in its
failure text and in the msprobe summary, live, under xdist and resumed), and `python -m pytest_msprobe baseline`
says which result set it read and how many failing items became how many entries."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_msprobe import __main__ as cli
from pytest_msprobe.records.record import Record
from pytest_msprobe.session import baseline
from tests.helpers import device_side_conftest, make_dump, tensor, two_ranks_same_names

LEAN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
XDIST = ("-n", "2", "-p", "xdist", *LEAN)

# gelu 5% off inside the device call: every gelu item fails, every relu item passes
PLANTED_GELU = device_side_conftest("""
    import torch.nn.functional as F
    IMPLS = {F.gelu: lambda orig, x, *a, **k: orig(x, *a, **k) * 1.05}
""")

# the relu entry (lines 5-8) lists a call that passes; the gelu entry one that still fails
BASELINE = """\
# reviewed known failures
- api: Functional.gelu.0.forward
  reason: reviewed, still failing

- api: Functional.relu.0.forward
  reason: >-
    was a known failure,
    fixed since
"""
ITEM_TEXT = ("[[]XPASS(strict)] msprobe baseline: passes now; remove lines 5-8 of bl.yaml "
             "(Functional.relu.0.forward: was a known failure, fixed since)")
SUMMARY = ["baseline: 1 item listed in bl.yaml now passes: counted as pass above, and as failed by pytest "
           "(XPASS(strict): 1 of pytest's 1 failed) until its entry is removed",
           "baseline: 1 entry now passes; remove it from bl.yaml:",
           "  lines 5-8 (Functional.relu.0.forward): 1 item passes"]


def unary(shape: list[int] | None = None, **kw: object) -> dict[str, object]:
    return {"input_args": [tensor(shape=shape, **kw)], "input_kwargs": {}, "output": [tensor(shape=shape)]}


def gelu_and_relus(pytester: pytest.Pytester) -> Path:
    pytester.makeconftest(PLANTED_GELU)
    return make_dump(pytester, {"Functional.relu.0.forward": unary(), "Functional.gelu.0.forward": unary([16, 16]),
                                "Functional.relu.1.forward": unary()})


def test_a_listed_item_that_passes_names_the_lines_to_remove(pytester: pytest.Pytester) -> None:
    dump = gelu_and_relus(pytester)
    (pytester.path / "bl.yaml").write_text(BASELINE)
    result = pytester.runpytest(str(dump), "--msprobe-baseline", "bl.yaml", *LEAN)
    result.assert_outcomes(failed=1, xfailed=1, passed=1)  # relu.0 is the XPASS(strict) failure
    result.stdout.fnmatch_lines([ITEM_TEXT, "*= msprobe =*", "items (strict verdicts): 0 SKIP, 0 Warning, 1 error, 2 pass", *SUMMARY])
    resumed = pytester.runpytest(str(dump), "--msprobe-resume", "--msprobe-baseline", "bl.yaml", *LEAN)
    resumed.assert_outcomes(failed=1, xfailed=1, passed=1)  # every item from the journal: the same words
    resumed.stdout.fnmatch_lines([ITEM_TEXT, "*3 taken from the journal*", *SUMMARY])
    lines = BASELINE.splitlines(keepends=True)
    (pytester.path / "bl.yaml").write_text("".join(lines[:4] + lines[8:]))  # lines 5-8 removed, as told
    fixed = pytester.runpytest(str(dump), "--msprobe-baseline", "bl.yaml", *LEAN)
    fixed.assert_outcomes(xfailed=1, passed=2)
    assert fixed.ret == pytest.ExitCode.OK
    fixed.stdout.no_fnmatch_line("baseline: *")


def test_an_entry_that_passes_in_one_dump_and_fails_in_another_is_to_narrow(pytester: pytest.Pytester) -> None:
    two_ranks_same_names(pytester)  # gelu passes in rank0, fails in rank1
    (pytester.path / "bl.yaml").write_text("- api: Functional.gelu.0.forward\n  reason: reviewed\n")
    result = pytester.runpytest("step0", "--msprobe-baseline", "bl.yaml", *XDIST)
    result.assert_outcomes(failed=1, xfailed=1, passed=2)
    result.stdout.fnmatch_lines([
        "[[]XPASS(strict)] msprobe baseline: passes now; remove lines 1-2 of bl.yaml (Functional.gelu.0.forward: "
        "reviewed)",
        "items (strict verdicts): 0 SKIP, 0 Warning, 1 error, 3 pass",
        "baseline: 1 item listed in bl.yaml now passes: counted as pass above, and as failed by pytest "
        "(XPASS(strict): 1 of pytest's 1 failed) until its entry is removed",
        "baseline: 1 entry also matches items that still fail; narrow it in bl.yaml to those:",
        "  lines 1-2 (Functional.gelu.0.forward): 1 of 2 items pass, e.g. step0/rank0/dump.json::Functional.gelu.0.forward"])
    result.stdout.no_fnmatch_line("*remove it from bl.yaml*")  # rank1's call still needs the entry


def test_the_writer_names_its_result_set_and_counts_items_as_entries(pytester: pytest.Pytester,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    pytester.makeconftest(PLANTED_GELU)
    make_dump(pytester, {"Functional.gelu.0.forward": unary([16, 16]), "Functional.relu.0.forward": unary()},
              name="step0/rank0")
    make_dump(pytester, {"Functional.gelu.0.forward": unary([16, 16]), "Functional.gelu.1.forward": unary([16, 16]),
                         "Functional.relu.0.forward": unary()}, name="step0/rank1")
    pytester.runpytest("step0", *LEAN).assert_outcomes(failed=3, passed=2)
    out = pytester.path / "msprobe_results"
    (newest,) = out.glob("msprobe_records_*.jsonl")
    older = {"nodeid": "x/dump.json::Functional.silu.0.forward", "api": "Functional.silu.0", "direction": "forward",
             "seed": 0, "status": "error", "dump": "x/dump.json", "message": "an older run"}
    (out / "msprobe_records_20000101000000.jsonl").write_text(json.dumps(older) + "\n")
    capsys.readouterr()
    assert cli.main(["baseline", str(out), "-o", str(pytester.path / "bl.yaml")]) == 0
    printed = capsys.readouterr().out.splitlines()
    stamp = re.fullmatch(r"msprobe_records_(\d{14})\.jsonl", newest.name).group(1)  # type: ignore[union-attr]
    when = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[8:10]}:{stamp[10:12]}:{stamp[12:]}"
    assert printed == [
        f"read {newest} (the newest of 2 result sets there, written {when})",
        f"3 failing items from 2 dumps as 2 entries written to {pytester.path / 'bl.yaml'}: one call fails in both "
        f"dumps, one entry per call (an entry that names the call matches it in every dump)"]
    entries = baseline.load(pytester.path / "bl.yaml")
    assert [e.api for e in entries] == ["Functional.gelu.0.forward", "Functional.gelu.1.forward"]
    result = pytester.runpytest("step0", "--msprobe-baseline", "bl.yaml", *LEAN)
    result.assert_outcomes(xfailed=3, passed=2)  # the 2 entries hold all 3 failing items
    assert result.ret == pytest.ExitCode.OK


def test_the_writer_says_so_when_nothing_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "msprobe_records_20240102030405.jsonl"
    records.write_text(json.dumps({"nodeid": "d/dump.json::Functional.relu.0.forward", "api": "Functional.relu.0",
                                   "direction": "forward", "seed": 0, "status": "pass", "dump": "d/dump.json"}) + "\n")
    assert cli.main(["baseline", str(records), "-o", str(tmp_path / "bl.yaml")]) == 0
    assert capsys.readouterr().out.splitlines() == [f"read {records} (as given)",
                                                    f"no failing items: wrote an empty baseline to {tmp_path / 'bl.yaml'}"]
    assert baseline.load(tmp_path / "bl.yaml") == []


def test_a_long_reason_is_cut_at_a_word_with_an_ellipsis() -> None:
    message = " ".join(f"check{i} failed" for i in range(80))  # about 1,000 characters
    ((entry,),) = [baseline.failures([Record("A.b.0", "forward", 0, status="error", message=message)])]
    reason = entry["reason"]
    assert reason.startswith("TODO review: ") and reason.endswith("…") and len(reason) <= len("TODO review: ") + 400
    kept = reason[len("TODO review: "):-1]
    assert message.startswith(kept) and message[len(kept)] == " ", kept[-20:]  # a whole word before the ellipsis
    short = baseline.failures([Record("A.b.0", "forward", 0, status="error", message="x y")])
    assert short[0]["reason"] == "TODO review: x y"


@pytest.mark.parametrize("text, lines", [
    (BASELINE, [(2, 3), (5, 8)]),
    ("baseline:\n  - api: a\n    reason: x\n\n  # next\n  - api: b\n    reason: |\n      y\n      z\n\n\n", [(2, 3), (6, 9)]),
    ('[{"api": "a", "reason": "x"},\n {"api": "b", "reason": "y"}]\n', [(1, 1), (2, 2)]),
])
def test_entries_know_their_lines(tmp_path: Path, text: str, lines: list[tuple[int, int]]) -> None:
    (tmp_path / "bl.yaml").write_text(text)
    assert [(e.first_line, e.last_line) for e in baseline.load(tmp_path / "bl.yaml")] == lines
