"""Small things a first run meets: where pytest's cache goes for a dump given by path, the command-line tool's
help, which seed a failure block shows."""
from __future__ import annotations

import argparse
import csv
import re

import pytest

from tests.helpers import device_side_conftest, make_dump, records, tensor

LEAN = ("-p", "no:hypothesispytest", "-p", "no:benchmark")


def _run_from_elsewhere(pytester: pytest.Pytester, text: str, *args: str) -> pytest.RunResult:
    """pytest on shared/dump.json (holding `text`), started in the folder here/ as a user beside the dump would."""
    shared = pytester.mkdir("shared")
    (shared / "dump.json").write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(pytester.mkdir("here"))
        return pytester.runpytest_subprocess(str(shared / "dump.json"), *args, *LEAN)


def test_a_dump_given_by_path_leaves_its_folder_without_a_pytest_cache(pytester: pytest.Pytester) -> None:
    result = _run_from_elsewhere(pytester, "{")  # a collection error: pytest's cache records it as last failed
    assert result.ret != pytest.ExitCode.OK  # the collection error
    here = pytester.path / "here"
    caches = sorted(pytester.path.rglob(".pytest_cache"))
    assert caches == [here / ".pytest_cache"], caches
    assert "shared/dump.json" in (here / ".pytest_cache" / "v" / "cache" / "lastfailed").read_text()


def test_a_run_without_the_cacheprovider_still_runs(pytester: pytest.Pytester) -> None:
    result = _run_from_elsewhere(pytester, "", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*dump.json: the file is empty (0 bytes)*"])  # collected, not an internal error
    assert not list(pytester.path.rglob(".pytest_cache"))


def test_a_cache_dir_the_user_sets_is_kept(pytester: pytest.Pytester) -> None:
    _run_from_elsewhere(pytester, "{", "-o", f"cache_dir={pytester.path / 'mine'}")
    assert sorted(p.name for p in pytester.path.rglob(".pytest_cache")) == []
    assert (pytester.path / "mine" / "v" / "cache" / "lastfailed").is_file()


def test_the_command_line_help_lists_each_subcommand_once_and_describes_it() -> None:
    from pytest_msprobe import __main__ as cli

    parser = cli.build_parser()
    text = parser.format_help()
    names = ("merge", "baseline", "compare", "script")
    for name in names:
        assert len(re.findall(rf"^\s+{name}\s", text, re.M)) == 1, text  # one line in the list of commands
    claim = " ".join(text.split()).split("None of the four needs pytest or torch")[0]
    assert all(name in claim for name in names), claim  # the no-torch sentence names every one
    for name, sub in cli_subcommands(parser).items():
        assert sub.description and len(sub.description) > 60, name  # its own --help says what it does


def cli_subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_csvs_keep_msprobes_status_and_message_where_strict_judges_otherwise(pytester: pytest.Pytester) -> None:
    """gelu 0.05 % off in fp32: strict's error (thousands of ULPs), run_ut's Warning (relative error > 1e-4). The
    CSVs carry run_ut's status with its own message, as docs/reference/results.md says; the records, strict's."""
    pytester.makeconftest(device_side_conftest("""
        import torch.nn.functional as F
        IMPLS = {F.gelu: lambda orig, x, *a, **k: orig(x, *a, **k) * 1.0005}
    """))
    entry = {"input_args": [tensor("torch.float32", [64, 64], 3.0, -3.0)], "input_kwargs": {},
             "output": [tensor("torch.float32", [64, 64])]}
    dump = make_dump(pytester, {"Functional.gelu.0.forward": entry})
    pytester.runpytest(str(dump), *LEAN, "-p", "no:cacheprovider").assert_outcomes(failed=1)
    out = pytester.path / "msprobe_results"
    (details,) = out.glob("accuracy_checking_details_*.csv")
    (row,) = list(csv.DictReader(details.open(encoding="utf-8-sig")))
    assert row["Status"] == "Warning" and row["Message"].startswith("Relative error is greater than 0.0001")
    (result,) = out.glob("accuracy_checking_result_*.csv")
    assert list(csv.reader(result.open(encoding="utf-8-sig")))[1][:2] == ["Functional.gelu.0", "Warning"]
    (record,) = records(pytester)
    assert record["status"] == "error" and record["outputs"][0]["verdict"] == "error"
    assert "gross error" in record["outputs"][0]["verdict_message"]
