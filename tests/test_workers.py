"""-n N starts only the workers the estimated work pays for (ini msprobe_min_work_per_worker)."""
from __future__ import annotations

from typing import Any

import pytest

from pytest_msprobe.session import workers
from tests.helpers import make_dump, tensor

pytest.importorskip("xdist")
LEAN = ("-p", "no:hypothesispytest", "-p", "no:benchmark")


def relu_dump(pytester: pytest.Pytester, count: int, name: str = "d") -> Any:
    entry = {"input_args": [tensor(shape=[4, 8])], "input_kwargs": {}, "output": [tensor(shape=[4, 8])]}
    return make_dump(pytester, {f"Functional.relu.{i}.forward": entry for i in range(count)}, name)


def big_dump(pytester: pytest.Pytester, count: int) -> Any:
    """Large matmuls: minutes of estimated work (only configured here, never run)."""
    entry = {"input_args": [tensor(shape=[4096, 4096]), tensor(shape=[4096, 4096])], "input_kwargs": {},
             "output": [tensor(shape=[4096, 4096])]}
    return make_dump(pytester, {f"Torch.matmul.{i}.forward": entry for i in range(count)}, "big")


def configured(pytester: pytest.Pytester, *args: str) -> pytest.Config:
    """A config as the controller has it when the plugin decides: xdist has read -n (its
    pytest_cmdline_main), then workers.adapt runs (in the plugin's pytest_configure)."""
    from xdist.plugin import pytest_cmdline_main

    config = pytester.parseconfig(*args, "-p", "xdist")
    pytest_cmdline_main(config)
    workers.adapt(config)
    return config


def test_small_work_stays_in_this_process_and_says_why(pytester: pytest.Pytester) -> None:
    dump = relu_dump(pytester, 40)
    result = pytester.runpytest_subprocess(str(dump), "-n", "2", "-p", "xdist", *LEAN)
    result.assert_outcomes(passed=40)
    result.stdout.fnmatch_lines(["msprobe: 40 items, about 0 s of estimated work: in this process instead of -n 2*"])
    assert "workers" not in result.stdout.str().split("msprobe: 40 items")[0]  # xdist started none
    forced = pytester.runpytest_subprocess(str(dump), "-n", "2", "-p", "xdist", "-o", "msprobe_min_work_per_worker=0",
                                           *LEAN)
    forced.assert_outcomes(passed=40)
    forced.stdout.fnmatch_lines(["created: 2/2 workers"])
    assert "estimated work" not in forced.stdout.str()


def test_enough_work_keeps_the_workers_asked_for(pytester: pytest.Pytester) -> None:
    dump = big_dump(pytester, 8)
    config = configured(pytester, str(dump), "-n", "2")
    assert config.option.numprocesses == 2 and config.option.dist == "load"
    assert workers.header_line(config) is None
    items, seconds = workers.estimate_seconds(config)  # type: ignore[misc]
    assert items == 8 and seconds > 2 * workers.DEFAULT_MIN_WORK_S


def test_fewer_workers_when_the_work_pays_for_some(pytester: pytest.Pytester) -> None:
    dump = big_dump(pytester, 8)
    _, seconds = workers.estimate_seconds(configured(pytester, str(dump)))  # type: ignore[misc]
    per_worker = seconds / 3.5  # worth three workers
    config = configured(pytester, str(dump), "-n", "8", "-o", f"msprobe_min_work_per_worker={per_worker}")
    assert config.option.numprocesses == 3 and len(config.option.tx) == 3
    assert "on 3 workers instead of -n 8" in workers.header_line(config)  # type: ignore[operator]


def test_the_estimate_follows_k_and_m_and_gives_up_on_unknown_subsets(pytester: pytest.Pytester) -> None:
    dump = big_dump(pytester, 8)
    _, everything = workers.estimate_seconds(configured(pytester, str(dump)))  # type: ignore[misc]
    items, picked = workers.estimate_seconds(configured(pytester, str(dump), "-k", "matmul.3 or matmul.5"))  # type: ignore[misc]
    assert items == 2 and picked == pytest.approx(everything / 4)
    assert workers.estimate_seconds(configured(pytester, str(dump), "-m", "backward")) == (0, 0.0)
    assert workers.estimate_seconds(configured(pytester, str(dump), "--lf")) is None
    pytester.makepyfile(test_other="def test_x():\n    pass\n")
    assert workers.estimate_seconds(configured(pytester, str(dump), "test_other.py")) is None


def test_bad_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(relu_dump(pytester, 2)), "-n", "2", "-p", "xdist",
                                "-o", "msprobe_min_work_per_worker=soon")
    result.stderr.fnmatch_lines(["*ini msprobe_min_work_per_worker: 'soon' is not a number of seconds*"])
