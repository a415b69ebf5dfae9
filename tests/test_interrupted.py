"""A run cut short never looks complete: the summary counts the items that never ran and gives the command that
resumes them, the exit status is not 0, with and without xdist (the controller interrupted, a worker interrupted,
a worker crashing with restarts off); the resumed run's progress is monotonic and over every item. Ctrl-C stops a
run at once, also while the bench runs beside the device in the helper thread."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import make_dump, tensor

pytest.importorskip("xdist")

LEAN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark")
XDIST = ("-n", "2", "-p", "xdist", "-o", "msprobe_min_work_per_worker=0", *LEAN)
TOTAL = 12

# After STOP_AFTER items of this process (of worker gw0 under xdist), stop the way STOP_MODE says.
STOPPER = """
    import os, signal, time
    done = []
    STARTED = os.path.join(os.path.dirname(__file__), "gw0-started")
    def pytest_runtest_call(item):
        time.sleep(0.05)  # both workers get items before the stop
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        if worker == "gw0":
            open(STARTED, "w").close()
        else:  # the other worker waits for gw0's first item: it cannot run every item before gw0 stops (a busy host)
            deadline = time.monotonic() + 60
            while not os.path.exists(STARTED) and time.monotonic() < deadline:
                time.sleep(0.01)
        done.append(item.nodeid)
        after, mode = int(os.environ.get("STOP_AFTER", "0")), os.environ.get("STOP_MODE", "")
        if not after or len(done) != after or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
            return
        if mode == "raise":  # Ctrl-C in this process
            raise KeyboardInterrupt
        if mode == "controller":  # Ctrl-C of the xdist controller only
            os.kill(os.getppid(), signal.SIGINT)
            time.sleep(5)
        if mode == "crash":
            os._exit(1)
"""


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_the_runs() -> Iterator[None]:
    """The runs below stop on SIGINT as from a terminal, also where this suite was started with SIGINT ignored (a
    script's background job: its children inherit that, and Python then installs no handler of its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # reset to the default in each child
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def _not_an_outer_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """This suite's own xdist worker name must not reach the runs below: STOPPER reads it as theirs."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


def relu_dump(pytester: pytest.Pytester) -> Path:
    entry = {"input_args": [tensor(shape=[4, 8])], "input_kwargs": {}, "output": [tensor(shape=[4, 8])]}
    return make_dump(pytester, {f"Functional.relu.{i}.forward": entry for i in range(TOTAL)})


def never_ran(result: pytest.RunResult) -> tuple[int, list[str]]:
    """(items the summary says never ran, the resume command's arguments after `pytest`)."""
    text = result.stdout.str()
    match = re.search(rf"NOT COMPLETE \([^)]*\): (\d+) of {TOTAL} items never ran", text)
    assert match, text
    command = re.search(rf"to run only those and report all {TOTAL}: (.*)", text)
    assert command, text
    args = shlex.split(command.group(1))
    assert args[0] == "pytest" and args[-1] == "--msprobe-resume", args
    return int(match.group(1)), args[1:]


def with_result(result: pytest.RunResult) -> int:
    outcomes = result.parseoutcomes()
    return sum(outcomes.get(k, 0) for k in ("passed", "failed", "skipped", "warned", "error"))


def progress(result: pytest.RunResult) -> list[int]:
    return [int(p) for p in re.findall(r"\[\s*(\d+)%\]", result.stdout.str())]


def resume(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> pytest.RunResult:
    """The printed command, verbose (a progress figure per item): every item reported, the progress monotonic."""
    monkeypatch.delenv("STOP_AFTER")
    result = pytester.runpytest_subprocess(*args, "-v")
    result.assert_outcomes(passed=TOTAL)
    assert result.ret == pytest.ExitCode.OK
    assert "NOT COMPLETE" not in result.stdout.str()
    steps = progress(result)
    assert steps == sorted(steps) and steps[-1] == 100 and len(steps) == TOTAL, steps
    return result


def test_an_interrupted_run_counts_what_never_ran_and_resumes_it(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(STOPPER)
    dump = relu_dump(pytester)
    monkeypatch.setenv("STOP_AFTER", "4")
    monkeypatch.setenv("STOP_MODE", "raise")
    first = pytester.runpytest_subprocess(str(dump), "--msprobe-seed", "random", "--msprobe-timeout", "60", *LEAN)
    assert first.ret == pytest.ExitCode.INTERRUPTED
    missing, args = never_ran(first)
    assert "-o msprobe_timeout=60" in shlex.join(args) and "--msprobe-timeout" not in args  # a former option respelled
    assert missing == TOTAL - 3 == TOTAL - with_result(first)  # the fourth was interrupted in its call
    first.stdout.fnmatch_lines([f"items (strict verdicts): *3 pass; {missing} never ran"])
    seed = re.search(r"msprobe: seed (\d+)", first.stdout.str())
    assert seed and args[args.index("--msprobe-seed") + 1] == seed.group(1)  # random pinned: resume matches
    second = resume(pytester, monkeypatch, args)
    second.stdout.fnmatch_lines(["*3 taken from the journal (--msprobe-resume)*"])


@pytest.mark.parametrize("mode", ["controller", "raise"])
def test_an_interrupted_xdist_run_is_not_green_and_says_what_never_ran(pytester: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       mode: str) -> None:
    """Ctrl-C of the controller, and of one worker (xdist turns that into a crashed item and stops)."""
    pytester.makeconftest(STOPPER)
    dump = relu_dump(pytester)
    monkeypatch.setenv("STOP_AFTER", "2")
    monkeypatch.setenv("STOP_MODE", mode)
    first = pytester.runpytest_subprocess(str(dump), *XDIST)
    assert first.ret == pytest.ExitCode.INTERRUPTED, first.stdout.str()
    missing, args = never_ran(first)
    assert 0 < missing == TOTAL - with_result(first)
    taken = TOTAL - missing - (mode == "raise")  # the worker's interrupted item is reported as a crash, and reruns
    second = resume(pytester, monkeypatch, args)
    second.stdout.fnmatch_lines([f"*{taken} taken from the journal (--msprobe-resume)*"])


def test_a_crashed_worker_without_restarts_leaves_the_run_incomplete(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(STOPPER)
    dump = relu_dump(pytester)
    monkeypatch.setenv("STOP_AFTER", "2")
    monkeypatch.setenv("STOP_MODE", "crash")
    first = pytester.runpytest_subprocess(str(dump), *XDIST, "--max-worker-restart", "0")
    assert first.ret == pytest.ExitCode.TESTS_FAILED
    missing, _ = never_ran(first)
    assert 0 < missing == TOTAL - with_result(first)


@pytest.mark.parametrize("xdist", [False, True])
def test_collect_only_is_not_an_incomplete_run(pytester: pytest.Pytester, xdist: bool) -> None:
    dump = relu_dump(pytester)
    result = pytester.runpytest_subprocess(str(dump), "--collect-only", "-q", *(XDIST if xdist else LEAN))
    assert result.ret == pytest.ExitCode.OK
    assert "NOT COMPLETE" not in result.stdout.str() and f"{TOTAL} tests collected" in result.stdout.str()


def test_another_suites_items_stopped_by_x_are_pytests_business(pytester: pytest.Pytester) -> None:
    """Plain tests beside the plugin: -x stops them as pytest does, with no msprobe line about items that never
    ran; the dump's items keep their count in a run that has both."""
    pytester.makepyfile(test_plain="def test_a():\n    assert False\n\ndef test_b():\n    pass\n")
    result = pytester.runpytest("-x", "test_plain.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "NOT COMPLETE" not in result.stdout.str()


# relu, a minute long in any thread but the main one: the bench beside the device (the helper thread) is slow, as a
# CPU bench beside a fast device is, so the items' thread waits for it
SLOW_BENCH = """
    import os, threading, time
    from pathlib import Path
    import torch

    _relu = torch.nn.functional.relu

    def relu(input, inplace=False):
        if threading.current_thread() is not threading.main_thread():
            Path(os.environ["BENCH_STARTED"]).touch()
            for _ in range(6000):
                time.sleep(0.01)
        return _relu(input, inplace=inplace)

    torch.nn.functional.relu = relu
"""


def test_ctrl_c_while_the_items_thread_waits_for_a_long_bench_stops_at_once(pytester: pytest.Pytester) -> None:
    """SIGINT, as Ctrl-C sends it to the run's process group: pytest's interrupted summary names where the items'
    thread waited (not threading.py), the resume line follows, and the process ends without running the rest of the
    bench (a minute), its metrics or the next item's inputs."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: the bench runs in the items' thread, there is no helper thread to wait for")
    pytester.makeconftest(SLOW_BENCH)
    dump = relu_dump(pytester)
    started = pytester.path / "bench_started"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}  # a core to spare, here
    run = subprocess.Popen([sys.executable, "-m", "pytest", str(dump), *LEAN], cwd=pytester.path, text=True,
                           env={**env, "BENCH_STARTED": str(started)}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the bench never ran beside the device"
        time.sleep(0.5)  # the items' thread is waiting for the bench now
        sent = time.monotonic()
        os.killpg(run.pid, signal.SIGINT)
        out, _ = run.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out
    assert took < 15, f"{took:.1f} s from SIGINT to exit\n{out}"  # the bench alone has 60 s left
    assert re.search(r"!+ KeyboardInterrupt !+\n\S*pytest_msprobe/\S+\.py:\d+: KeyboardInterrupt\n", out), out
    assert "threading.py" not in out and "Traceback" not in out and "Exception ignored" not in out, out
    assert re.search(rf"NOT COMPLETE \(interrupted\): {TOTAL} of {TOTAL} items never ran", out), out
    assert re.search(rf"to run only those and report all {TOTAL}: pytest .*--msprobe-resume\n", out), out
