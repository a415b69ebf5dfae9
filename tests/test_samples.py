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

from tests.doc_samples import code_blocks, missing_from, normalise, same_line
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


def ci_gate_files() -> tuple[tuple[str, str], ...]:
    """The CI gate page's fixed softmax: the tutorial's fix and the page's baseline.yaml of the two failures it fixes."""
    yaml = code_blocks((ROOT / "docs/how-to/ci-gate.md").read_text(encoding="utf-8"), "yaml")
    (listed,) = [b for b in yaml if "Functional.softmax" in b]
    return (*tutorial_files(), ("baseline.yaml", listed))


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
    ("docs/how-to/ci-gate.md", 0): Sample("pytest examples/approximate_kernel/ --msprobe-kernels kernels.py:KERNELS "
                                          "--msprobe-baseline baseline.yaml", ci_gate_files()),
    ("docs/how-to/resume.md", 0): Sample("pytest examples/mlp_fp32_tensor/", (("conftest.py", CTRL_C),)),
}
# samples held by the test that runs the session they come from: (page, block) -> (test module, test function)
HELD_ELSEWHERE: dict[tuple[str, int], tuple[str, str]] = {
    ("docs/how-to/online.md", 0): ("test_online_gate.py", "test_a_client_that_disconnects_without_stop_fails_the_run"),
    ("docs/how-to/online.md", 1): ("test_online_gate.py", "test_quiet_clients_that_stop_later_are_named_once"),
    ("docs/how-to/online.md", 2): ("test_online_msprobe.py", "test_the_example_client_one_process_and_two_ranks"),
    ("docs/reference/options.md", 0): ("test_plugin.py", "test_a_former_option_still_works_and_says_its_replacement_once"),
    ("docs/how-to/check-a-training-step.md", 0): ("test_inprocess.py",
                                                  "test_the_example_loop_passes_and_its_bug_fails_as_the_page_shows"),
}


# Outputs quoted in the text: (page, what it says, the command it says it of, what the output holds, exit status)
INLINE: list[tuple[str, str, str, str, int]] = [
    ("docs/tutorial/first-dump.md", "`2 failed, 328 passed, 20 skipped, 6 reference-only`", "pytest examples/",
     "== 2 failed, 328 passed, 20 skipped, 6 reference-only in <t>s ==", 1),
    ("docs/tutorial/first-dump.md", "(`MindSpore is not installed (20: MintFunctional.linear, MintFunctional.relu, "
     "MintFunctional.silu, …): pip install mindspore; ...`)", "pytest examples/",
     "  MindSpore is not installed (20: MintFunctional.linear, MintFunctional.relu, MintFunctional.silu, …): pip "
     "install mindspore; a tensor dump is checked without it (--msprobe-mode replay)", 1),
    ("docs/tutorial/first-dump.md", "(`msprobe: mint_mlp_fp32_tensor/step0/rank0 MintFunctional.silu.0.forward`)",
     "pytest examples/", "__ msprobe: mint_mlp_fp32_tensor/step0/rank0 MintFunctional.silu.0.forward __", 1),
    ("docs/tutorial/first-dump.md", "`0 Warning` items and `61 Warning` CSV rows", "pytest examples/",
     "items (strict verdicts): 20 SKIP, 0 Warning, 2 error, 328 pass", 1),
    ("docs/tutorial/first-dump.md", "`0 Warning` items and `61 Warning` CSV rows", "pytest examples/",
     "PyTorch dumps' details CSV rows (msprobe's Layer-1 Status, original standard; one per output): 0 SKIP, "
     "61 Warning, 2 error, 300 pass", 1),
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
        _RUNS[key] = _without_notices(done.stdout.replace(str(tmp), "<here>")), done.returncode
    return _RUNS[key]


def _without_notices(output: str) -> str:
    """The warm-up notices appear only on a cold numba cache or a busy machine (the tutorial quotes them apart)."""
    from pytest_msprobe.session import terminal

    return "\n".join(line for line in output.splitlines()
                     if not line.startswith((terminal.COMPILING, terminal.WORKERS_COMPILING, terminal.LOADING)))


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


def test_a_sample_holds_decimals_to_three_digits_and_everything_else_exactly() -> None:
    """A bench's last digits are the host BLAS's (another CPU vendor sums in another order); counts are not."""
    page = "output.0  (1, 8, 512, 64)  error    0.999995  0.0524845    0.536133     [0, 6, 186, 20]  -4.34375"
    assert same_line(page, page.replace("0.536133", "0.536129"))
    assert not same_line(page, page.replace("0.536133", "0.537133"))
    assert not same_line(page, page.replace("186", "187"))
    assert not same_line(page, page.replace("error", "pass"))
    assert not same_line("== 3 failed, 1 passed in <t>s ==", "== 4 failed, 1 passed in <t>s ==")
    assert not same_line("torch 2.13.0", "torch 2.13.1")


def test_the_tutorials_fix_passes_on_a_bf16_softmax_and_the_same_fix_in_bf16_does_not(pytester: pytest.Pytester) -> \
        None:
    """The tutorial says its fix holds for every dtype: held on a bf16 call, beside the same kernel computing in bf16
    (what a new user writes first), which must fail."""
    from tests.helpers import make_dump, tensor

    (_, softmax), (_, kernels) = tutorial_files()
    pytester.makepyfile(stable_softmax=softmax,
                        bf16_softmax=softmax.replace("x = input.to(", "x = input  # ").replace(
                            ".to(input.dtype)", ""))
    pytester.makepyfile(kernels=kernels, kernels_bf16=kernels.replace("stable_softmax", "bf16_softmax"))
    t = "torch.bfloat16"
    dump = make_dump(pytester, {
        "Functional.softmax.0.forward": {"input_args": [tensor(t, [2, 4, 128, 128], mx=8.0, mn=-8.0, requires_grad=True)],
                                         "input_kwargs": {"dim": {"type": "int", "value": -1}},
                                         "output": [tensor(t, [2, 4, 128, 128], mx=1.0, mn=0.0)]},
        "Functional.softmax.0.backward": {"input": [tensor(t, [2, 4, 128, 128])],
                                          "output": [tensor(t, [2, 4, 128, 128])]}})
    fixed = pytester.runpytest_subprocess(str(dump), "-p", "no:cacheprovider", "--msprobe-kernels", "kernels.py:KERNELS")
    fixed.assert_outcomes(passed=2)
    in_bf16 = pytester.runpytest_subprocess(str(dump), "-p", "no:cacheprovider", "--msprobe-kernels",
                                            "kernels_bf16.py:KERNELS")
    in_bf16.assert_outcomes(passed=1, failed=1)  # the gradient, through bf16 exp, sum and division
    in_bf16.stdout.fnmatch_lines(["*Functional.softmax.0.backward: error*"])
