"""Node ids of dumps outside the rootdir, the short summary of a collection error, folder arguments
without a dump.json."""
from __future__ import annotations

import re

import pytest

from tests.helpers import make_dump, records, tensor

LEAN = ("-p", "no:cacheprovider")


def _relu(top: float = 1.0) -> dict[str, object]:
    return {"Functional.relu.0.forward": {"input_args": [tensor(mx=top)], "input_kwargs": {},
                                          "output": [tensor()]}}


def _ids(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "::" in line]


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["n0", "n2"])
def test_dumps_outside_the_rootdir_get_unique_non_empty_stable_node_ids(pytester: pytest.Pytester,
                                                                         workers: tuple[str, ...]) -> None:
    root = pytester.mkdir("root")
    (root / "pytest.ini").write_text("[pytest]\n")
    inside = make_dump(pytester, _relu(), "root/inside")
    one, two = make_dump(pytester, _relu(), "out/one/x"), make_dump(pytester, _relu(2.0), "out/two/x")
    args = (str(inside), str(one), str(two), "--rootdir", str(root), *LEAN)
    ids = _ids(pytester.runpytest(*args, "--collect-only", "-q"))
    assert ids == ["inside/dump.json::Functional.relu.0.forward",
                   f"{one.as_posix()}::Functional.relu.0.forward", f"{two.as_posix()}::Functional.relu.0.forward"]
    assert ids == _ids(pytester.runpytest(*args, "--collect-only", "-q"))  # stable
    folders = _ids(pytester.runpytest(str(pytester.path / "out"), "--rootdir", str(root), "--collect-only", "-q",
                                      *LEAN))  # a folder argument outside the rootdir: each dump its own path
    assert folders == [f"{one.as_posix()}::Functional.relu.0.forward", f"{two.as_posix()}::Functional.relu.0.forward"]
    result = pytester.runpytest(*args, *workers)
    result.assert_outcomes(passed=3)
    assert sorted(r["nodeid"] for r in records(pytester)) == sorted(ids)


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["n0", "n2"])
def test_a_collection_error_says_what_failed_in_the_short_summary(pytester: pytest.Pytester,
                                                                  workers: tuple[str, ...]) -> None:
    good = make_dump(pytester, _relu(), "good")
    bad = pytester.mkdir("bad") / "dump.json"
    bad.write_text('{"task": "statistics", "data": {')
    result = pytester.runpytest(str(good), str(bad), "-vv", *workers, *LEAN)  # -vv: the line is not cut
    result.assert_outcomes(passed=1, errors=1)
    line = next(x for x in result.outlines if x.startswith("ERROR "))
    assert re.fullmatch(r"ERROR bad/dump\.json - \S+/bad/dump\.json: not valid JSON at line 1 .*truncated.*", line), line


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["n0", "n2"])
def test_a_folder_argument_without_a_dump_is_reported(pytester: pytest.Pytester, workers: tuple[str, ...]) -> None:
    empty = pytester.mkdir("empty")
    (empty / "notes.txt").write_text("no dump here\n")
    alone = pytester.runpytest(str(empty), *workers, *LEAN)
    assert alone.ret == pytest.ExitCode.TESTS_FAILED
    alone.assert_outcomes(errors=1)
    assert any(re.fullmatch(r"ERROR empty - no dump\.json in this folder argument .*", x) for x in alone.outlines), alone.outlines
    good = make_dump(pytester, _relu(), "good")
    both = pytester.runpytest(str(good), str(empty), *workers, *LEAN)
    both.assert_outcomes(passed=1, errors=1)
    tests = pytester.mkdir("tests")  # a folder of Python tests without any: pytest's own "no tests ran"
    (tests / "test_nothing.py").write_text("X = 1\n")
    assert pytester.runpytest(str(tests), *LEAN).ret == pytest.ExitCode.NO_TESTS_COLLECTED
