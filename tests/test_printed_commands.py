"""Every command the plugin prints does what its line says, run as printed: its words (shlex), from the directory
of the run that printed it, in a subprocess. The commands are taken from the output, never written here:

* the `rerun:` line of a failure fails that item alone, the same way;
* the `replay:` command of saved error data (under each failure and in the `msprobe triage` summary) fails every
  saved item the same way (and with `--msprobe-mode replay` too), and passes once the kernel is fixed;
* the repro scripts (`msprobe repro` sections, the `repro scripts:` summary) print the item's numbers, and so does
  the `rerun:` line a script prints about itself;
* the script `python -m pytest_msprobe script` writes runs the call;
* the resume command of an interrupted run reports every item.

The failing run is examples/approximate_kernel with its KERNELS: an approximate softmax whose overflowing rows
become NaN, forward and backward."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES

BIN = Path(sys.executable).parent
# the commands name `pytest` and `python`: this interpreter's (PYTHONPATH, the package under test, is passed on)
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")},
       "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
FAILING = ("Functional.softmax.1.forward", "Functional.softmax.1.backward")


@pytest.fixture(scope="module", autouse=True)
def _commands_of_this_interpreter() -> None:
    for name in ("pytest", "python"):
        found = shutil.which(name, path=ENV["PATH"])
        if found is None or Path(found).parent != BIN:
            pytest.skip(f"no `{name}` beside {sys.executable}: the printed commands would run another one")


def run(command: str | list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A printed command as a user runs it (a list: a command of this test, not one printed)."""
    args = shlex.split(command) if isinstance(command, str) else command
    return subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900, check=False)


@dataclass
class Failure:
    """One failed item as pytest printed it: its report (table and messages) and its named sections."""
    head: list[str]
    sections: dict[str, list[str]]

    @property
    def rows(self) -> list[str]:
        """The numbers: each output's table row and verdict lines (the same in a re-run and a replay)."""
        return [line for line in self.head if line.startswith("output")]

    @property
    def report(self) -> list[str]:
        """Everything the item printed but the command that reruns it, which names its own node, and the seed of
        drawn inputs, which a run of the saved tensors (real data) does not print."""
        return [line for line in self.head if not line.startswith(("rerun: ", "item seed: "))]


def failures(text: str) -> dict[str, Failure]:
    """The failures of a run's output by entry name (the `msprobe: <entry>` headers pytest writes)."""
    found: dict[str, Failure] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = re.fullmatch(r"_{3,} msprobe: (\S+) _{3,}", line)
        section = re.fullmatch(r"-{3,} (.+?) -{3,}", line)
        if header:
            failure = found[header.group(1)] = Failure([], {})
            current = failure.head
        elif line.startswith(("____", "====")):
            current = None
        elif section and current is not None:
            current = failure.sections.setdefault(section.group(1), [])
        elif current is not None:
            current.append(line)
    return found


def failed(text: str) -> set[str]:
    """The entries of the short test summary's FAILED lines."""
    return {m.group(1) for m in re.finditer(r"^FAILED \S+::(\S+)", text, re.M)}


def printed(pattern: str, text: str) -> list[str]:
    commands = re.findall(pattern, text, re.M)
    assert commands, f"no {pattern!r} in\n{text}"
    return commands


@dataclass
class Run:
    cwd: Path
    out: str

    @property
    def failures(self) -> dict[str, Failure]:
        return failures(self.out)


def failing_run(cwd: Path, *extra: str) -> Run:
    shutil.copytree(EXAMPLES / "approximate_kernel", cwd / "approximate_kernel")
    result = run([sys.executable, "-m", "pytest", "approximate_kernel/", "--msprobe-kernels",
                  "approximate_kernel/kernels.py:KERNELS", "--msprobe-save-error-data", "err", "--msprobe-repro", "repro",
                  "-p", "no:cacheprovider", *extra], cwd)
    assert result.returncode == 1, result.stdout + result.stderr
    assert failed(result.stdout) == set(FAILING), result.stdout
    return Run(cwd, result.stdout)


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return failing_run(tmp_path_factory.mktemp("printed"))


def assert_fails_the_same_way(again: subprocess.CompletedProcess[str], before: Run, replayed: bool = False) -> None:
    """The same items fail with the same verdicts and numbers (a replay of the saved outputs: the same numbers)."""
    assert again.returncode == 1, again.stdout + again.stderr
    assert failed(again.stdout) == set(before.failures), again.stdout
    after = failures(again.stdout)
    for entry, old in before.failures.items():
        assert after[entry].rows == old.rows if replayed else after[entry].report == old.report, (entry, again.stdout)


def test_each_rerun_line_fails_its_item_alone_the_same_way(first: Run) -> None:
    for entry, failure in first.failures.items():
        (command,) = [line.removeprefix("rerun: ") for line in failure.head if line.startswith("rerun: ")]
        again = run(command, first.cwd)
        assert again.returncode == 1 and failed(again.stdout) == {entry}, again.stdout + again.stderr
        assert failures(again.stdout)[entry].report == failure.report, again.stdout


def replay_command(run_: Run) -> str:
    """The one replay command the run printed: under each failure and in the `msprobe triage` summary."""
    under = [re.fullmatch(r"saved in .+? \(replay: (.+)\)", line)
             for failure in run_.failures.values() for line in failure.sections["msprobe error data"]]
    summary = printed(r"^error data: \d+ dump\(s\) in .+? \(replay: (.+)\)$", run_.out)
    commands = {m.group(1) for m in under if m} | set(summary)
    assert len(under) == len(FAILING) and all(under) and len(commands) == 1, run_.out
    return commands.pop()


def test_the_replay_command_of_the_saved_error_data_fails_every_saved_item_the_same_way(first: Run) -> None:
    command = replay_command(first)
    assert_fails_the_same_way(run(command, first.cwd), first)
    # what the page says to add to judge the failing run's device outputs themselves: the same numbers
    assert_fails_the_same_way(run(f"{command} --msprobe-mode replay", first.cwd), first, replayed=True)


@pytest.fixture
def fixed_kernel(first: Run) -> Iterator[None]:
    """The run's kernel with its bug fixed (the row maximum subtracted before exp), then as it was."""
    kernel = first.cwd / "approximate_kernel" / "naive_softmax.py"
    source = kernel.read_text()
    bug = "e = torch.exp(input)"
    assert bug in source
    kernel.write_text(source.replace(bug, "e = torch.exp(input - input.amax(dim, keepdim=True))"))
    try:
        yield
    finally:
        kernel.write_text(source)


def test_the_replay_command_checks_a_fixed_kernel_on_the_saved_inputs(first: Run, fixed_kernel: None) -> None:
    again = run(replay_command(first), first.cwd)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(rf"\b{len(FAILING)} passed\b", again.stdout), again.stdout
    assert re.search(r"^msprobe kernels: .* substitutes Functional\.softmax", again.stdout, re.M), again.stdout


def test_the_repro_scripts_and_the_rerun_line_each_prints_give_the_items_numbers(first: Run) -> None:
    scripts = [failure.sections["msprobe repro"][0] for failure in first.failures.values()]
    scripts += printed(r"^repro scripts: \d+, e\.g\. (python .+)$", first.out)
    assert len(set(scripts)) == len(FAILING), first.out
    for command in scripts:
        again = run(command, first.cwd)
        assert again.returncode == 1 and "same numbers as the item: yes" in again.stdout, again.stdout + again.stderr
        (itself,) = printed(r"^rerun: (python .+)$", again.stdout)
        once_more = run(itself, first.cwd)
        assert once_more.returncode == 1 and "same numbers as the item: yes" in once_more.stdout, once_more.stdout


def test_the_script_of_a_call_runs_as_the_line_that_wrote_it_says(first: Run) -> None:
    """A call's script (here of a saved failure, replaying its saved device output) checks that call."""
    target = f"{first.cwd / 'err' / 'dump.json'}::{FAILING[0]}"
    wrote = run([sys.executable, "-m", "pytest_msprobe", "script", target, "--mode", "replay"], first.cwd)
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    (command,) = printed(r"^wrote \S+: (python \S+) ", wrote.stdout)
    again = run(command, first.cwd)
    assert again.returncode == 1 and "verdict: error" in again.stdout, again.stdout + again.stderr
    assert again.stdout.startswith(f"{FAILING[0]}  standard=strict"), again.stdout


def test_under_xdist_the_same_commands_are_printed(first: Run, tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    other = failing_run(tmp_path, "-n", "2", "-p", "xdist", "-o", "msprobe_min_work_per_worker=0")

    def commands(run_: Run) -> list[str]:
        lines = [line for failure in run_.failures.values() for part in (failure.head, *failure.sections.values())
                 for line in part if line.startswith(("rerun: ", "saved in ", "python "))]
        return sorted(line.replace(str(run_.cwd), "<run>") for line in lines)

    assert commands(other) == commands(first)
    assert replay_command(other).replace(str(tmp_path), "<run>") == \
        replay_command(first).replace(str(first.cwd), "<run>")


STOPPER = """
    import os
    done = []
    def pytest_runtest_call(item):
        done.append(item.nodeid)
        if len(done) == int(os.environ.get("STOP_AFTER") or 0):
            raise KeyboardInterrupt
"""


def test_the_resume_command_of_an_interrupted_run_reports_every_item(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(STOPPER)
    shutil.copytree(EXAMPLES / "mlp_fp32_tensor", pytester.path / "mlp")
    cut = subprocess.run([sys.executable, "-m", "pytest", "mlp/", "--msprobe-seed", "random", "-p", "no:cacheprovider"],
                         cwd=pytester.path, env={**ENV, "STOP_AFTER": "3"}, capture_output=True, text=True,
                         timeout=900, check=False)
    assert cut.returncode == pytest.ExitCode.INTERRUPTED, cut.stdout + cut.stderr
    match = re.search(r"^to run only those and report all (\d+): (.+)$", cut.stdout, re.M)
    assert match, cut.stdout
    total, command = int(match.group(1)), match.group(2)
    again = run(command, pytester.path)
    assert again.returncode == pytest.ExitCode.OK, again.stdout + again.stderr
    assert re.search(rf"\b{total} passed\b", again.stdout) and "NOT COMPLETE" not in again.stdout, again.stdout
    assert re.search(r"\b2 taken from the journal\b", again.stdout), again.stdout
