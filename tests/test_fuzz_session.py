"""--msprobe-fuzz in the session: journal and --msprobe-resume, the `rerun:` line, Ctrl-C."""
from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.helpers import make_dump
from tests.triage_helpers import PLANTED, relu_fp16

LEAN = ("-p", "no:cacheprovider")

# SIGINT while hypothesis replays the failing example for the last time: hypothesis catches what lands
# there (`except BaseException`) and reports it as the test's error, so the run used to go on.
INTERRUPT_IN_FINAL_REPLAY = """
import os
import signal

from hypothesis import core

_original = core.StateForActualGivenExecution.execute_once


def execute_once(self, data, *args, is_final=False, **kwargs):
    if is_final:
        os.kill(os.getpid(), signal.SIGINT)
    return _original(self, data, *args, is_final=is_final, **kwargs)


core.StateForActualGivenExecution.execute_once = execute_once
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (an xdist worker's children ignore it)
"""


def _counts(text: str) -> dict[str, int]:
    line = [x for x in text.splitlines() if re.search(r"\d+ (passed|failed)", x)][-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", line)}


def _msprobe_counts(text: str) -> dict[str, int]:
    """pytest's words for the statuses of the msprobe summary's `items (<standard> verdicts):` line, API and [fuzz]
    items summed."""
    line = next(x for x in text.splitlines() if x.startswith("items ("))
    out: dict[str, int] = {}
    for n, status in re.findall(r"(\d+) (pass|error|SKIP|Warning)", line):
        word = {"pass": "passed", "Warning": "passed", "error": "failed", "SKIP": "skipped"}[status]
        out[word] = out.get(word, 0) + int(n)
    return {k: v for k, v in out.items() if v}


def test_ctrl_c_during_fuzzing_stops_the_run_and_the_counts_agree(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PLANTED + INTERRUPT_IN_FINAL_REPLAY)
    data = {**relu_fp16(), "Functional.relu.1.forward": relu_fp16()["Functional.relu.0.forward"]}
    dump = make_dump(pytester, data)
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-fuzz", "40", *LEAN)
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, text
    assert "KeyboardInterrupt" in text
    assert "_hypothesis_internal_database_key" not in text and "AssertionError" not in text, text
    assert "Functional.relu.1.forward" not in text  # nothing ran after the interrupted item
    assert _counts(text) == {"passed": 1} == _msprobe_counts(text), text


def _two_relus() -> dict[str, dict[str, object]]:
    return {**relu_fp16(), "Functional.relu.1.forward": relu_fp16()["Functional.relu.0.forward"]}


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["n0", "n2"])
def test_resume_reports_a_journaled_fuzz_failure_instead_of_dropping_it(pytester: pytest.Pytester,
                                                                         workers: tuple[str, ...]) -> None:
    pytester.makeconftest(PLANTED)
    dump = make_dump(pytester, _two_relus())
    args = (str(dump), "--msprobe-fuzz", "40", *LEAN)
    first = pytester.runpytest_subprocess(*args, "-x")  # stops at the first failure, as Ctrl-C would
    first.assert_outcomes(passed=1, failed=1)
    journaled = [json.loads(line) for line in (pytester.path / "msprobe_results/msprobe_journal.jsonl").open()]
    fuzz = [line for line in journaled if "fuzz" in line]
    assert [line["nodeid"] for line in fuzz] == ["d/dump.json::Functional.relu.0.forward[fuzz]"]
    assert fuzz[0]["fuzz"]["status"] == "error" and fuzz[0]["entry_key"]
    (pytester.path / "conftest.py").unlink()  # the bug is gone: a re-run fuzz item would pass
    resumed = pytester.runpytest_subprocess(*args, "--msprobe-resume", *workers)
    resumed.assert_outcomes(passed=3, failed=1)
    text = resumed.stdout.str()
    assert "2 taken from the journal (--msprobe-resume)" in text
    assert re.search(r"FAILED \S*d/dump.json::Functional.relu.0.forward\[fuzz\]", text)
    assert "shrunk to:\n  input_args.0 float16[4, 4]" in text
    assert "fuzz: 2 API(s), 40 examples each, 1 failing" in text
    assert _counts(text) == {"passed": 3, "failed": 1} == _msprobe_counts(text)
    again = pytester.runpytest_subprocess(*args, "--msprobe-fuzz", "41", "--msprobe-resume")  # other N: runs
    again.assert_outcomes(passed=4)


def _rerun_args(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("rerun: "))
    args = shlex.split(line[len("rerun: "):])
    assert args[0] == "pytest"
    return args[1:]


def _has_pair(args: list[str], flag: str, value: str) -> bool:
    """`flag value` appear together in args (a rerun line may repeat -o)."""
    return any(a == flag and b == value for a, b in zip(args, args[1:]))


def test_the_rerun_line_of_a_fuzz_failure_reproduces_it_with_its_plugin(pytester: pytest.Pytester,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CI", "BUILD_NUMBER"):  # with either set, pytest repeats whole messages in the short summary
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(bug=PLANTED)  # loaded with -p bug, not as a conftest
    dump = make_dump(pytester, _two_relus())
    sub = pytester.mkdir("elsewhere")  # another working directory and rootdir: the node id differs
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-fuzz", "40", "-p", "bug", "-o", "msprobe_threads=3",
                                           "-o", "msprobe_warning_as_error=true", *LEAN)
    result.assert_outcomes(passed=2, failed=2)
    rerun = _rerun_args(result.stdout.str())
    assert rerun[rerun.index("-p") + 1] == "bug" and _has_pair(rerun, "-o", "msprobe_warning_as_error=true")
    assert _has_pair(rerun, "-o", "msprobe_threads=3")
    alone = pytester.runpytest_subprocess(*rerun, *LEAN)
    alone.assert_outcomes(failed=1)
    shrunk = re.findall(r"shrunk to:\n  (.*)\n", result.stdout.str())[0]
    assert re.findall(r"shrunk to:\n  (.*)\n", alone.stdout.str()) == [shrunk]
    monkey = pytest.MonkeyPatch()
    monkey.chdir(sub)
    try:  # from another directory, with the plugin importable: the same examples and the same failure
        moved = pytester.runpytest_subprocess(*rerun, "--rootdir", str(sub), *LEAN,
                                              "-o", f"pythonpath={pytester.path}")
    finally:
        monkey.undo()
    moved.assert_outcomes(failed=1)
    assert re.findall(r"shrunk to:\n  (.*)\n", moved.stdout.str()) == [shrunk]
    selected = pytester.runpytest_subprocess(str(dump), "--msprobe-fuzz", "40", "-p", "bug", "-k",
                                             "Functional.relu.0.forward", *LEAN)
    selected.assert_outcomes(passed=1, failed=1)


# The torch thread count the device call sees, written next to the dump.
THREADS_SEEN = """
import pytest


@pytest.hookimpl(wrapper=True)
def pytest_msprobe_device_call(item_name):
    import torch
    with open("threads.txt", "a") as f:
        f.write(f"{torch.get_num_threads()}\\n")
    return (yield)
"""


def test_a_fuzz_item_running_first_gets_the_run_thread_count(pytester: pytest.Pytester) -> None:
    import os

    pytester.makeconftest(THREADS_SEEN)
    dump = make_dump(pytester, relu_fp16())
    threads = 3 if (os.cpu_count() or 1) != 3 else 5  # not torch's default, the core count
    result = pytester.runpytest_subprocess(f"{dump}::Functional.relu.0.forward[fuzz]", "--msprobe-fuzz", "3",
                                           "-o", f"msprobe_threads={threads}", *LEAN)
    result.assert_outcomes(passed=1)
    assert set((pytester.path / "threads.txt").read_text().split()) == {str(threads)}


def test_the_rerun_line_of_an_api_failure_keeps_plugins_and_verdict_options(pytester: pytest.Pytester) -> None:
    from tests.triage_helpers import gelu_bf16

    pytester.makepyfile(bug=PLANTED)
    specs = pytester.makefile(".yaml", specs="{}\n")
    dump = make_dump(pytester, gelu_bf16())
    result = pytester.runpytest_subprocess(f"{dump}::Functional.gelu.0.forward", "-p", "bug", "-o",
                                           f"msprobe_specs={specs.name}", "-o", "msprobe_data_mode=random",
                                           "--msprobe-seed", "77", *LEAN)
    result.assert_outcomes(failed=1)
    rerun = _rerun_args(result.stdout.str())
    for flag, value in (("-p", "bug"), ("-o", f"msprobe_specs={specs}"), ("-o", "msprobe_data_mode=random"),
                        ("--msprobe-seed", "77"), ("--msprobe-standard", "strict")):
        assert _has_pair(rerun, flag, value), rerun
    pytester.runpytest_subprocess(*rerun, *LEAN).assert_outcomes(failed=1)
    without = [a for i, a in enumerate(rerun) if a != "-p" and (i == 0 or rerun[i - 1] != "-p")]
    pytester.runpytest_subprocess(*without, *LEAN).assert_outcomes(passed=1)  # the plugin is what fails it


# A local module full of float constants in the recorded range: hypothesis mixes the constants of the
# local modules loaded so far into its draws, so what a process had imported changed a seed's examples.
CONSTANTS_MODULE = "VALUES = [" + ", ".join(repr(round(0.01 + 0.0087 * i, 4)) for i in range(340)) + "]\n"

# Every example a [fuzz] item checks, as a digest of its drawn tensors, appended to examples.txt.
EXAMPLES_SEEN = """
import hashlib
import os

import pytest_msprobe.check as check

_original = check.check_entry


def check_entry(dump, name, options, specs):
    digest = hashlib.md5()
    for file in sorted(os.listdir(dump.tensor_dir)):
        digest.update(open(os.path.join(dump.tensor_dir, file), "rb").read())
    with open("examples.txt", "a") as f:
        f.write(digest.hexdigest() + "\\n")
    return _original(dump, name, options, specs)


check.check_entry = check_entry
"""


def test_a_fuzz_seed_draws_the_same_examples_whatever_the_process_imported(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(EXAMPLES_SEEN)
    dump = make_dump(pytester, relu_fp16())
    args = (f"{dump}::Functional.relu.0.forward[fuzz]", "--msprobe-fuzz", "60", *LEAN)
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)
    plain = (pytester.path / "examples.txt").read_text().split()
    (pytester.path / "examples.txt").unlink()
    pytester.makepyfile(consts=CONSTANTS_MODULE)
    pytester.runpytest_subprocess(*args, "-p", "consts").assert_outcomes(passed=1)  # imported before the item
    assert len(plain) == 60 and (pytester.path / "examples.txt").read_text().split() == plain
