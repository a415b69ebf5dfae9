"""ini msprobe_keep_runs: msprobe_results/ keeps the newest N result sets."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_msprobe.reports.result_sets import keep_newest, result_sets
from tests.helpers import make_dump, tensor

LEAN = ("-p", "no:cacheprovider")
OTHERS = ("notes.txt", "accuracy_checking_result_latest.csv", "msprobe_records_1.jsonl", "repro.py")


def _old_sets(out: Path, count: int) -> list[str]:
    """`count` sets of an earlier day (per-dump CSVs, MindSpore and compare files too) and files of other names."""
    out.mkdir(parents=True, exist_ok=True)
    stamps = [f"202001010000{i:02d}" for i in range(count)]
    for ts in stamps:
        for name in (f"accuracy_checking_result_{ts}_rank0.csv", f"accuracy_checking_details_{ts}_rank0.csv",
                     f"accuracy_checking_details_{ts}_mindspore.csv", f"api_precision_compare_result_{ts}.csv",
                     f"msprobe_records_{ts}.jsonl"):
            (out / name).write_text("x\n")
    for name in OTHERS:
        (out / name).write_text("keep me\n")
    return stamps


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["n0", "n2"])
def test_a_run_keeps_the_newest_sets_and_says_what_it_removed(pytester: pytest.Pytester,
                                                              workers: tuple[str, ...]) -> None:
    dump = make_dump(pytester, {"Functional.relu.0.forward": {"input_args": [tensor()], "input_kwargs": {},
                                                              "output": [tensor()]}})
    out = pytester.path / "msprobe_results"
    stamps = _old_sets(out, 12)
    result = pytester.runpytest(str(dump), *workers, *LEAN)  # the default keeps 10: this run's and 9 older
    result.assert_outcomes(passed=1)
    kept = list(result_sets(out))
    assert len(kept) == 10 and kept[:9] == stamps[3:] and kept[9] > stamps[-1]
    result.stdout.fnmatch_lines([f"result sets in {out}: 10, the newest 10 are kept (msprobe_keep_runs=10); "
                                 f"removed 3 older set(s): {', '.join(stamps[:3])}"])
    assert all((out / name).read_text() == "keep me\n" for name in OTHERS)
    two = pytester.runpytest(str(dump), "-o", "msprobe_keep_runs=2", *workers, *LEAN)
    left = list(result_sets(out))
    assert len(left) == 2 and left[1] >= kept[9] and set(left) <= {stamps[-1], *kept[9:], left[1]}
    assert re.search(r"removed \d+ older set\(s\)", two.stdout.str())
    every = pytester.runpytest(str(dump), "-o", "msprobe_keep_runs=0", *LEAN)
    assert "all are kept (msprobe_keep_runs=0)" in every.stdout.str()
    assert len(result_sets(out)) in (2, 3)  # 3 unless this run had the last run's second


def test_a_bad_number_of_sets_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-o", "msprobe_keep_runs=-1", *LEAN)
    result.stderr.fnmatch_lines(["*ini msprobe_keep_runs wants a number of result sets >= 0, got -1*"])
    pytester.makeini("[pytest]\nmsprobe_keep_runs = many\n")
    result = pytester.runpytest(*LEAN)
    result.stderr.fnmatch_lines(["*ini msprobe_keep_runs wants a number of result sets >= 0, got 'many'*"])


def test_keep_newest_touches_only_result_sets(tmp_path: Path) -> None:
    stamps = _old_sets(tmp_path, 3)
    assert keep_newest(tmp_path, 0) == (stamps, [])
    assert keep_newest(tmp_path, 1) == (stamps[-1:], stamps[:-1])
    assert sorted(p.name for p in tmp_path.iterdir() if stamps[-1] not in p.name) == sorted(OTHERS)
    assert keep_newest(tmp_path / "missing", 1) == ([], [])
