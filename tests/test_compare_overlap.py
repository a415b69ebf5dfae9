"""With a spare core, msprobe's metrics of a large output and its strict checks run side by side, in two threads."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch

from pytest_msprobe.check import check_entry
from pytest_msprobe.check.compare import OVERLAP_MIN_ELEMENTS, Comparison, compare_floats
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.records.record import Record
from pytest_msprobe.session import devices
from pytest_msprobe.session.journal import run_fingerprint
from pytest_msprobe.settings import CheckOptions, Settings
from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import judge, standards
from tests.helpers import tensor

SPECS = load_specs()


def _threads_of(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[str]:
    """The names of the threads that call owner.name from now on."""
    ran_in: list[str] = []
    plain = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        ran_in.append(threading.current_thread().name)
        return plain(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return ran_in


def _large_gelu(write_dump: Any) -> Any:
    shape = [1024, OVERLAP_MIN_ELEMENTS // 1024 + 8]
    data = {"Functional.gelu.0.forward": {"input_args": [tensor("torch.bfloat16", shape, mx=4.0, mn=-4.0)],
                                          "input_kwargs": {}, "output": [tensor("torch.bfloat16", shape)]}}
    return load_dump(write_dump(data))


def test_metrics_run_in_the_helper_beside_the_torch_run_with_the_same_records(write_dump, monkeypatch) -> None:
    dump = _large_gelu(write_dump)
    metrics_in = _threads_of(monkeypatch, standards, "compare_structure")
    strict_in = _threads_of(monkeypatch, judge, "strict_verdict")
    records = [check_entry(dump, "Functional.gelu.0.forward",
                           CheckOptions(device="cpu", standard="strict", work_threads=n), SPECS) for n in (1, 2)]
    assert metrics_in == ["MainThread", "msprobe-helper_0"]
    assert strict_in == ["MainThread", "MainThread"]  # beside the metrics, once the torch run is done
    one, two = (r.outputs for r in records)
    assert one == two and one[0].verdict == "pass" and one[0].reference["max_err"] >= 0


def test_without_early_metrics_the_strict_checks_run_in_the_helper(write_dump, monkeypatch) -> None:
    """A comparison whose metrics did not start early (replay mode) hands its strict checks over instead."""
    bench = torch.randn(512, 200, dtype=torch.float64)
    device = bench.to(torch.bfloat16)
    strict_in = _threads_of(monkeypatch, judge, "strict_verdict")
    rows = []
    for n in (1, 2):
        record = Record("Functional.gelu.0", "forward", 0)
        compare_floats(Comparison(record, "Functional.gelu.0.forward.output", [bench], [device], None, "torch", "gelu",
                                  SPECS, CheckOptions(device="cpu", standard="strict", work_threads=n)))
        rows.append(record.to_dict()["outputs"])
    assert strict_in == ["MainThread", "msprobe-helper_0"]
    assert rows[0] == rows[1] and rows[0][0]["verdict"] == "pass"


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
    assert record.status == "pass"
    assert names == (["MainThread"] if standard == "strict" else [])
