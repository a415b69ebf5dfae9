"""A new user's first run: what the terminal says while the checks compile, and pytest's own timer.

On a machine whose numba cache is cold the first item's warm-up compiles the checks (about 40 s of the README's
first command on two cores), and the run printed nothing meanwhile; the notice says why it waits.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.session import numba_cache
from pytest_msprobe.session.terminal import COMPILING, LOADING, WORKERS_COMPILING
from tests.helpers import ROOT, make_dump, tensor

LEAN = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def relu() -> dict[str, Any]:
    return {"input_args": [tensor()], "input_kwargs": {}, "output": [tensor()]}


def slow_warm_up(pytester: pytest.Pytester, threshold: str, after: float, *, sleep: float,
                 cached: bool = False) -> None:
    """A conftest for a run in its own process that makes the plugin's warm-up `sleep` seconds slower, as a cold
    numba cache (or a busy machine) makes it, says whether numba's cache holds the checks (`cached`), and sets the
    notice's `threshold` (a constant of session/terminal.py) to `after`."""
    pytester.makeconftest(textwrap.dedent(f"""
        import time
        from pytest_msprobe.check import compare
        from pytest_msprobe.session import numba_cache, terminal

        terminal.{threshold} = {after}
        numba_cache.checks_cached = lambda: {cached}
        _warm_up = compare.warm_up

        def slow_warm_up(standard):
            time.sleep({sleep})
            _warm_up(standard)

        compare.warm_up = slow_warm_up
    """))


@pytest.mark.parametrize("sleep, shown", [(0.6, True), (0.0, False)])
def test_a_slow_block_is_announced_and_a_fast_one_is_not(pytester: pytest.Pytester, sleep: float, shown: bool) -> None:
    pytester.makepyfile(textwrap.dedent(f"""
        import time
        from pytest_msprobe.session.terminal import notice_if_slow

        def test_block(request):
            with notice_if_slow(request.config, "STILL WORKING", after=0.2):
                time.sleep({sleep})
            time.sleep(0.4)  # past `after`: a cancelled notice stays unsaid
    """))
    result = pytester.runpytest(*LEAN)
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count("STILL WORKING") == (1 if shown else 0)


def test_the_first_items_slow_warm_up_says_it_is_compiling(pytester: pytest.Pytester) -> None:
    """The plugin's warm-up, made slow as a cold cache makes it (a separate process: this one has warmed up
    already), is announced once, before the first item's result, and pytest's timer counts it."""
    dump = make_dump(pytester, {"Functional.relu.0.forward": relu(), "Functional.relu.1.forward": relu()})
    slow_warm_up(pytester, "SLOW_WARM_UP_S", 0.2, sleep=1.0)
    result = pytester.runpytest_subprocess(str(dump), *LEAN)
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert out.count(COMPILING) == 1
    assert out.index(COMPILING) < out.index("dump.json ..")
    seconds = float(re.search(r"2 passed in ([0-9.]+)s", out).group(1))  # type: ignore[union-attr]
    assert seconds >= 1.0


@pytest.mark.parametrize("workers", [False, True])
def test_a_slow_warm_up_from_numbas_cache_does_not_say_compiling(pytester: pytest.Pytester, workers: bool) -> None:
    """The cache holds the checks (a busy machine makes loading them slow): no "compiling" notice."""
    dump = make_dump(pytester, {f"Functional.relu.{i}.forward": relu() for i in range(4)})
    slow_warm_up(pytester, "SLOW_FIRST_RESULT_S" if workers else "SLOW_WARM_UP_S", 0.2, sleep=1.0, cached=True)
    xdist = ("-n", "2", "-o", "msprobe_min_work_per_worker=0") if workers else ()
    result = pytester.runpytest_subprocess(str(dump), *xdist, *LEAN)
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    assert COMPILING not in out and WORKERS_COMPILING not in out and LOADING not in out  # 1 s < SLOW_LOAD_S


def test_numbas_cache_is_found_where_numba_keeps_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This process compiled the checks (the suite's warm-up), so numba's cache holds them wherever it keeps them;
    an empty NUMBA_CACHE_DIR, the only place numba then looks, holds nothing."""
    assert numba_cache.checks_cached()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert not numba_cache.checks_cached()


def test_the_suites_conftest_costs_the_readmes_first_command_nothing() -> None:
    """pytest loads tests/conftest.py for `pytest --msprobe-api-info dump.json` from the repository root (testpaths):
    importing it must not import torch or numba, nor compile anything (the suite's fixture does that)."""
    code = "import sys, tests.conftest; print(sorted({'torch', 'numba', 'hypothesis'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_xdist_workers_compiling_is_announced_by_the_controller(pytester: pytest.Pytester) -> None:
    """Under xdist the workers' terminals are not seen: the controller says why no result has come yet, once."""
    dump = make_dump(pytester, {f"Functional.relu.{i}.forward": relu() for i in range(4)})
    slow_warm_up(pytester, "SLOW_FIRST_RESULT_S", 0.5, sleep=2.0)
    result = pytester.runpytest_subprocess(str(dump), "-n", "2", "-o", "msprobe_min_work_per_worker=0", *LEAN)
    result.assert_outcomes(passed=4)
    assert result.stdout.str().count(WORKERS_COMPILING) == 1
