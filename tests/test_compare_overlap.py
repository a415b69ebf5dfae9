"""A large output's strict checks run in a thread beside msprobe's metrics when a core is spare."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from pytest_msprobe.check import check_entry
from pytest_msprobe.check.compare import OVERLAP_MIN_ELEMENTS
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.session import devices
from pytest_msprobe.session.journal import run_fingerprint
from pytest_msprobe.settings import CheckOptions, Settings
from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import judge
from tests.helpers import tensor

SPECS = load_specs()


def test_overlapped_checks_give_the_same_records_in_a_thread(write_dump, monkeypatch) -> None:
    shape = [1024, OVERLAP_MIN_ELEMENTS // 1024 + 8]
    data = {"Functional.gelu.0.forward": {"input_args": [tensor("torch.bfloat16", shape, mx=4.0, mn=-4.0)],
                                          "input_kwargs": {}, "output": [tensor("torch.bfloat16", shape)]}}
    dump = load_dump(write_dump(data))
    ran_in: list[str] = []
    plain = judge.strict_verdict

    def spy(*args: Any) -> Any:
        ran_in.append(threading.current_thread().name)
        return plain(*args)

    monkeypatch.setattr(judge, "strict_verdict", spy)
    records = [check_entry(dump, "Functional.gelu.0.forward",
                           CheckOptions(device="cpu", standard="strict", work_threads=n), SPECS) for n in (1, 2)]
    assert ran_in[0] == "MainThread" and ran_in[1].startswith("msprobe-strict") and len(ran_in) == 2
    one, two = (r["outputs"] for r in records)
    assert one == two and one[0]["verdict"] == "pass" and one[0]["reference"]["max_err"] >= 0


def test_a_spare_core_is_counted_per_worker(monkeypatch) -> None:
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert devices.work_threads(1) == 2  # -n 0 on two cores: one torch thread, one spare
    assert devices.work_threads(2) == 1
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert devices.work_threads(1) == 1  # -n 2 on two cores: no spare core


def test_resume_keys_ignore_per_process_options() -> None:
    """The controller and its workers compute the same keys although their compare threads differ."""
    base = Settings(CheckOptions(device="cpu"))
    other = dataclasses.replace(base, check_options=dataclasses.replace(base.check_options, work_threads=2,
                                                                        device_index=1))
    assert run_fingerprint(base) == run_fingerprint(other)
    seeded = dataclasses.replace(base, check_options=dataclasses.replace(base.check_options, run_seed=7))
    assert run_fingerprint(base) != run_fingerprint(seeded)


@pytest.mark.parametrize("standard", ["msprobe", "strict"])
def test_small_outputs_stay_in_the_calling_thread(write_dump, monkeypatch, standard: str) -> None:
    data = {"Functional.gelu.0.forward": {"input_args": [tensor("torch.float16", [64, 64])], "input_kwargs": {},
                                          "output": [tensor("torch.float16", [64, 64])]}}
    dump = load_dump(write_dump(data))
    names: list[str] = []
    plain = judge.strict_verdict
    monkeypatch.setattr(judge, "strict_verdict",
                        lambda *a: names.append(threading.current_thread().name) or plain(*a))
    record = check_entry(dump, "Functional.gelu.0.forward",
                         CheckOptions(device="cpu", standard=standard, work_threads=2), SPECS)
    assert record["status"] == "pass"
    assert names == (["MainThread"] if standard == "strict" else [])
