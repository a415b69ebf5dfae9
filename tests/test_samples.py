"""Every sample of terminal output in README.md and docs/ (each ```text block) comes from a real run of the command
beside it, and fails here when the output drifts (how a sample is held against a run: tests/doc_samples.py).

Each sample's command runs as a user runs it (a pytest process in a folder holding a copy of examples/, this
checkout's package first on the path). The online session's samples need a client beside the session: the online
tests hold them (HELD_ELSEWHERE). A new ```text block without a command here fails too.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doc_samples import code_blocks, missing_from, normalise
from tests.helpers import ROOT

# Ctrl-C after the fifth item (a KeyboardInterrupt where SIGINT would raise it), for the interrupted run's sample
CTRL_C = """
import itertools
_count = itertools.count(1)
def pytest_runtest_call(item):
    if next(_count) == 6:
        raise KeyboardInterrupt
"""


@dataclass(frozen=True)
class Sample:
    command: str  # as the page shows it
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written beside examples/ first


def tutorial_files() -> tuple[tuple[str, str], ...]:
    """The tutorial's fix: its stable_softmax.py and kernels.py, as the page gives them."""
    python = code_blocks((ROOT / "docs/tutorial/first-dump.md").read_text(encoding="utf-8"), "python")
    (softmax,) = [b for b in python if "def softmax" in b]
    (kernels,) = [b for b in python if b.startswith("KERNELS")]
    return (("stable_softmax.py", softmax), ("kernels.py", kernels))


BUGGY_FLASH = "pytest examples/fused_attention/ --msprobe-kernels examples/fused_attention/kernels.py:BUGGY"
FAILING_SOFTMAX = ("pytest examples/approximate_kernel/ --msprobe-kernels examples/approximate_kernel/kernels.py:KERNELS "
                   "--msprobe-html report.html")
SAMPLES: dict[tuple[str, int], Sample] = {
    ("README.md", 0): Sample(FAILING_SOFTMAX),
    ("docs/tutorial/first-dump.md", 0): Sample("pytest --msprobe-api-info examples/mlp_fp32_tensor/step0/rank0/dump.json"),
    ("docs/tutorial/first-dump.md", 1): Sample(FAILING_SOFTMAX),
    ("docs/tutorial/first-dump.md", 2): Sample("pytest examples/approximate_kernel/ --msprobe-kernels kernels.py:KERNELS",
                                               tutorial_files()),
    ("docs/how-to/own-kernels.md", 0): Sample(
        "pytest examples/approximate_kernel/ --msprobe-kernels examples/approximate_kernel/kernels.py:KERNELS"),
    ("docs/how-to/check-a-fused-kernel.md", 0): Sample(BUGGY_FLASH),
    ("docs/how-to/resume.md", 0): Sample("pytest examples/mlp_fp32_tensor/", (("conftest.py", CTRL_C),)),
}
# samples held by the test that runs the session they come from: (page, block) -> (test module, test function)
HELD_ELSEWHERE: dict[tuple[str, int], tuple[str, str]] = {
    ("docs/how-to/online.md", 0): ("test_online_gate.py", "test_a_client_that_disconnects_without_stop_fails_the_run"),
    ("docs/how-to/online.md", 1): ("test_online_gate.py", "test_quiet_clients_that_stop_later_are_named_once"),
    ("docs/how-to/online.md", 2): ("test_online_msprobe.py", "test_the_example_client_one_process_and_two_ranks"),
    ("docs/reference/options.md", 0): ("test_plugin.py", "test_a_former_option_still_works_and_says_its_replacement_once"),
}


# Outputs quoted in the text: (page, what it says, the command it says it of, what the output holds, exit status)
INLINE: list[tuple[str, str, str, str, int]] = [
    ("docs/tutorial/first-dump.md", "`2 failed, 328 passed, 20 skipped, 6 reference-only`", "pytest examples/",
     "== 2 failed, 328 passed, 20 skipped, 6 reference-only in <t>s ==", 1),
    ("docs/tutorial/first-dump.md", "`2 xfailed`, exit 0",
     "pytest examples/ --msprobe-baseline examples/baseline.yaml", "== 328 passed, 20 skipped, 2 xfailed, "
     "6 reference-only in <t>s ==", 0),
    ("docs/how-to/check-a-fused-kernel.md", "(`3 failed, 1 passed`)", BUGGY_FLASH, "== 3 failed, 1 passed in <t>s ==", 1),
    ("docs/how-to/check-a-fused-kernel.md", "The sound kernel passes its 4 items",
     "pytest examples/fused_attention/ --msprobe-kernels examples/fused_attention/kernels.py:SOUND",
     "== 4 passed in <t>s ==", 0),
    ("docs/how-to/many-devices.md", "`msprobe: 18 items, about 0 s of estimated work: in this process instead of -n 2",
     "pytest examples/mlp_fp32_tensor/step0/rank0/dump.json -n 2", "msprobe: 18 items, about 0 s of estimated work: "
     "in this process instead of -n 2 (a worker costs more to start than it would save; -o msprobe_min_work_per_worker="
     "0 starts every worker)", 0),
]


def pages() -> list[str]:
    found = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")
                                   if "_build" not in p.parts)
    return found


_RUNS: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, int]] = {}


def run(sample: Sample, tmp: Path) -> tuple[str, int]:
    """The command's output and exit status in a fresh folder holding examples/ (once per command and files)."""
    key = (sample.command, sample.files)
    if key not in _RUNS:
        shutil.copytree(ROOT / "examples", tmp / "examples")
        for name, text in sample.files:
            (tmp / name).write_text(text, encoding="utf-8")
        args = shlex.split(sample.command)
        assert args[0] == "pytest"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        for name in ("PYTEST_ADDOPTS", "CI", "BUILD_NUMBER"):  # a CI's variables make pytest print whole messages
            env.pop(name, None)
        done = subprocess.run([sys.executable, "-m", *args], cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=600)
        _RUNS[key] = done.stdout.replace(str(tmp), "<here>"), done.returncode
    return _RUNS[key]


def test_every_text_block_has_its_command_here() -> None:
    blocks = {(page, i) for page in pages()
              for i, _ in enumerate(code_blocks((ROOT / page).read_text(encoding="utf-8"), "text"))}
    assert blocks == set(SAMPLES) | set(HELD_ELSEWHERE), "a ```text block without a command in SAMPLES, or one gone"
    for (page, index), (module, test) in HELD_ELSEWHERE.items():
        source = (ROOT / "tests" / module).read_text(encoding="utf-8")
        assert f"def {test}(" in source and f'"{page}", {index}' in source, (page, index, module, test)


@pytest.mark.parametrize("page, index", sorted(SAMPLES), ids=lambda v: str(v))
def test_the_sample_is_what_the_command_prints(page: str, index: int, tmp_path: Path) -> None:
    sample = SAMPLES[(page, index)]
    text = (ROOT / page).read_text(encoding="utf-8")
    assert sample.command in " ".join(text.replace("\\\n", " ").split()), f"{page} does not show {sample.command!r}"
    output, _ = run(sample, tmp_path)
    missing = missing_from(output, page, index)
    assert missing is None, f"{page} block {index}: not in the output, in this order:\n{missing}\n\n--- output:\n{output}"


@pytest.mark.parametrize("page, quoted, command, printed, status", INLINE, ids=lambda v: str(v)[:40])
def test_an_output_quoted_in_the_text_is_what_the_command_prints(page: str, quoted: str, command: str, printed: str,
                                                                 status: int, tmp_path: Path) -> None:
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert quoted in text and command in text, (page, quoted, command)
    output, returncode = run(Sample(command), tmp_path)
    assert printed in normalise(output, "<here>"), output[-3000:]
    assert returncode == status


def test_the_warm_up_notices_quoted_in_the_tutorial_are_the_plugins() -> None:
    """They need a cold numba cache or a very busy machine to appear: held against the texts the plugin prints."""
    from pytest_msprobe.session import terminal

    text = " ".join((ROOT / "docs/tutorial/first-dump.md").read_text(encoding="utf-8").split())
    for notice in (terminal.COMPILING, terminal.LOADING):
        quoted = re.search(rf"`({re.escape(notice[:30])}[^`]*?) \.\.\.`", text)
        assert quoted and notice.startswith(quoted.group(1)), notice
