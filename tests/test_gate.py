"""The CI gate and resume in every documented spelling: resume finds its items wherever the
command is run from, a resumed run reports the journaled results, a run that checked nothing is red,
and after a resume one set of result files remains."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from pytest_msprobe import __main__ as cli
from pytest_msprobe.session import baseline
from tests.helpers import (
    EXAMPLES,
    copy_dump,
    device_side_conftest,
    make_dump,
    records,
    tensor,
    two_ranks_same_names,
)

BF16_EXAMPLE = EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0"
LEAN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
XDIST = ("-n", "2", "-p", "xdist", *LEAN)

# gelu 5% off inside the device call (the bench and strict's torch run are untouched): one reproducible failure.
PLANTED_GELU = device_side_conftest("""
    import torch.nn.functional as F
    IMPLS = {F.gelu: lambda orig, x, *a, **k: orig(x, *a, **k) * 1.05}
""")


def unary(shape: list[int] | None = None, **kw: object) -> dict[str, object]:
    return {"input_args": [tensor(shape=shape, **kw)], "input_kwargs": {}, "output": [tensor(shape=shape)]}


def mixed_dump(pytester: pytest.Pytester, with_gelu: bool = True) -> Path:
    data = {"Functional.relu.0.forward": unary(), "Functional.relu.1.forward": unary()}
    if with_gelu:
        data["Functional.gelu.0.forward"] = unary([16, 16], mx=3.0, mn=0.5)
    return make_dump(pytester, data)


def result_files(folder: Path) -> dict[str, list[Path]]:
    return {kind: sorted(folder.glob(pattern)) for kind, pattern in (
        ("result", "accuracy_checking_result_*.csv"), ("details", "accuracy_checking_details_*.csv"),
        ("jsonl", "msprobe_records_*.jsonl"))}


# --------------------------------------------------------------------------- 1. resume and the rootdir


def test_resume_finds_finished_items_when_the_out_dir_is_written_with_a_space(
        pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory) -> None:
    copy_dump(pytester, BF16_EXAMPLE, "steering")
    out = tmp_path_factory.mktemp("volume") / "out"  # outside the dump's folder: an existing path argument
    first = pytester.runpytest("steering", f"--msprobe-out={out}", *LEAN)
    assert first.parseoutcomes()["passed"] > 0
    assert out.is_dir()
    # `--msprobe-out DIR` with DIR existing: pytest counts DIR when it picks the rootdir and node ids change
    second = pytester.runpytest("steering", "--msprobe-out", str(out), "--msprobe-resume", *LEAN)
    second.stdout.fnmatch_lines(["*resuming from*: 18 finished item(s) there*",
                                 "*18 taken from the journal (--msprobe-resume)*"])
    journal = (out / "msprobe_journal.jsonl").read_text().splitlines()
    assert sum('"nodeid"' in line for line in journal) == 18  # nothing ran again


def test_resume_finds_finished_items_from_another_directory(pytester: pytest.Pytester,
                                                            tmp_path_factory: pytest.TempPathFactory,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "steering")
    out = pytester.path / "out"
    pytester.runpytest("steering", f"--msprobe-out={out}", *LEAN)
    # the dump as a positional path from a directory outside the first run's rootdir: the rootdir moves up
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    second = pytester.runpytest(str(dump), f"--msprobe-out={out}", "--msprobe-resume", *LEAN)
    second.stdout.fnmatch_lines(["*18 taken from the journal (--msprobe-resume)*"])
    journal = (out / "msprobe_journal.jsonl").read_text().splitlines()
    assert sum('"nodeid"' in line for line in journal) == 18
    final = records(pytester, "out")  # this run's node ids
    assert len(final) == 18 and all(r["nodeid"].startswith(f"{pytester.path.name}/steering/dump.json::")
                                    for r in final), final[0]["nodeid"]


# --------------------------------------------------------------------------- 2. a fully resumed run's gate


@pytest.mark.parametrize("xdist", [False, True], ids=["n0", "xdist"])
def test_fully_resumed_run_reports_the_journaled_results(pytester: pytest.Pytester, xdist: bool) -> None:
    pytester.makeconftest(PLANTED_GELU)
    dump = mixed_dump(pytester)
    first = pytester.runpytest(str(dump), *LEAN)
    first.assert_outcomes(failed=1, passed=2)
    run = pytester.runpytest_subprocess if xdist else pytester.runpytest
    second = run(str(dump), "--msprobe-resume", *(XDIST if xdist else LEAN))
    assert second.ret == pytest.ExitCode.TESTS_FAILED
    second.assert_outcomes(failed=1, passed=2)
    second.stdout.fnmatch_lines(["*3 taken from the journal (--msprobe-resume)*",
                                 "*short test summary info*",
                                 "FAILED d/dump.json::Functional.gelu.0.forward - *"])
    second.stdout.no_fnmatch_line("*PASSED*relu*")
    assert [r["status"] for r in records(pytester)] == ["pass", "pass", "error"]


def test_fully_resumed_passing_run_is_green(pytester: pytest.Pytester) -> None:
    dump = mixed_dump(pytester, with_gelu=False)
    pytester.runpytest(str(dump), *LEAN).assert_outcomes(passed=2)
    second = pytester.runpytest(str(dump), "--msprobe-resume", "--junitxml", "j.xml", *LEAN)
    assert second.ret == pytest.ExitCode.OK
    second.assert_outcomes(passed=2)
    assert (pytester.path / "j.xml").read_text().count("<testcase") == 2


def test_resumed_failure_still_honours_the_baseline(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PLANTED_GELU)
    dump = mixed_dump(pytester)
    pytester.runpytest(str(dump), *LEAN).assert_outcomes(failed=1, passed=2)
    (pytester.path / "bl.yaml").write_text("- api: Functional.gelu.0.forward\n  reason: reviewed\n")
    second = pytester.runpytest(str(dump), "--msprobe-resume", "--msprobe-baseline", "bl.yaml", *LEAN)
    assert second.ret == pytest.ExitCode.OK
    second.assert_outcomes(xfailed=1, passed=2)


# --------------------------------------------------------------------------- 3. a gate that checked nothing


def test_a_run_where_every_item_skips_fails_with_one_line_unless_allowed(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, {"Distributed.all_reduce.0.forward": unary(),
                                "Distributed.broadcast.0.forward": unary()})
    result = pytester.runpytest(str(dump), *LEAN)
    result.assert_outcomes(skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    lines = [line for line in result.outlines if "nothing was checked" in line]
    assert len(lines) == 1 and "all 2 API items were skipped" in lines[0], result.outlines
    assert "-o msprobe_allow_all_skipped=true" in lines[0]
    allowed = pytester.runpytest(str(dump), "-o", "msprobe_allow_all_skipped=true", *LEAN)
    assert allowed.ret == pytest.ExitCode.OK
    pytester.makeini("[pytest]\nmsprobe_allow_all_skipped = true\n")
    assert pytester.runpytest(str(dump), *LEAN).ret == pytest.ExitCode.OK


def test_one_checked_item_among_skips_keeps_the_gate_green(pytester: pytest.Pytester) -> None:
    dump = make_dump(pytester, {"Distributed.all_reduce.0.forward": unary(), "Functional.relu.0.forward": unary()})
    result = pytester.runpytest(str(dump), *LEAN)
    result.assert_outcomes(skipped=1, passed=1)
    assert result.ret == pytest.ExitCode.OK


# --------------------------------------------------------------------------- 6. one set of files after a resume


def test_after_a_resume_one_set_of_result_files_remains(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest("""
        import os
        def pytest_runtest_call(item):
            if os.environ.get("STOP_AT") and item.name == os.environ["STOP_AT"]:
                raise KeyboardInterrupt
    """)
    dump = make_dump(pytester, {f"Functional.relu.{i}.forward": unary() for i in range(6)})
    monkeypatch.setenv("STOP_AT", "Functional.relu.3.forward")
    first = pytester.runpytest_subprocess(str(dump), *LEAN)  # Ctrl-C at the fourth item
    assert first.ret == pytest.ExitCode.INTERRUPTED
    out = pytester.path / "msprobe_results"
    partial = result_files(out)
    assert [len(v) for v in partial.values()] == [1, 1, 1]  # the interrupted run wrote its partial set
    monkeypatch.delenv("STOP_AT")
    time.sleep(1.1 - time.time() % 1)  # the resumed run's files get another timestamp
    second = pytester.runpytest(str(dump), "--msprobe-resume", *LEAN)
    second.assert_outcomes(passed=6)
    final = result_files(out)
    assert [len(v) for v in final.values()] == [1, 1, 1], final
    assert final["result"] != partial["result"]
    rows = list(csv.reader(final["result"][0].open(encoding="utf-8-sig")))
    assert [r[0] for r in rows[1:]] == [f"Functional.relu.{i}" for i in range(6)]
    second.stdout.fnmatch_lines(["*removed * file(s) of an earlier run, superseded by these*"])


# --------------------------------------------------------------------------- 8. the baseline writer's reasons


def test_baseline_writer_gives_the_failing_check_as_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PLANTED_GELU)
    dump = mixed_dump(pytester)
    pytester.runpytest(str(dump), *LEAN).assert_outcomes(failed=1, passed=2)
    assert cli.main(["baseline", str(pytester.path / "msprobe_results"), "-o", str(pytester.path / "bl.yaml")]) == 0
    ((api, reason, *_),) = baseline.load(pytester.path / "bl.yaml")
    assert api == "Functional.gelu.0.forward"
    assert "error: error" not in reason and reason.startswith("TODO review: output.0: "), reason
    (failed,) = [r for r in records(pytester) if r["status"] == "error"]
    first_check = failed["outputs"][0]["verdict_message"].split(";")[0]  # e.g. strict's "gross error: ..."
    assert first_check and " ".join(first_check.split()) in reason, (first_check, reason)


def test_baseline_of_a_call_failing_in_one_dump_keeps_the_gate_green(pytester: pytest.Pytester) -> None:
    two_ranks_same_names(pytester)  # the same gelu call passes in rank0 and fails in rank1
    pytester.runpytest("step0", *LEAN).assert_outcomes(failed=1, passed=3)
    assert cli.main(["baseline", str(pytester.path / "msprobe_results"), "-o", str(pytester.path / "bl.yaml")]) == 0
    assert [e.api for e in baseline.load(pytester.path / "bl.yaml")] == ["*rank1/dump.json::Functional.gelu.0.forward"]
    result = pytester.runpytest("step0", "--msprobe-baseline", "bl.yaml", *LEAN)
    result.assert_outcomes(xfailed=1, passed=3)  # rank0's passing gelu is no XPASS(strict)
    assert result.ret == pytest.ExitCode.OK
