"""evals/probes/controller_probe.py: at -n 2 the controller writes one line of CPU by cause, each cause called
as often as the run calls it (three reports per item); at -n 0 it writes nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.probes.controller_probe import main

ROOT = Path(__file__).resolve().parents[1]
DUMP = ROOT / "examples" / "mlp_bf16_statistics" / "step0" / "rank0" / "dump.json"


@pytest.mark.parametrize("workers", [0, 2])
def test_the_controller_writes_its_causes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], workers: int) -> None:
    pytest.importorskip("xdist")
    out = pytester.path / "ctl.jsonl"
    monkeypatch.setenv("MSPROBE_CONTROLLER_PROBE", str(out))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess(str(DUMP), "-p", "evals.probes.controller_probe", "-p", "no:hypothesispytest",
                                           "--msprobe-device", "cpu", "-n", str(workers),
                                           "-o", "msprobe_min_work_per_worker=0", "--msprobe-out", "out")
    outcomes = result.parseoutcomes()
    items = outcomes.get("passed", 0) + outcomes.get("failed", 0)
    assert items > 0
    if not workers:
        assert not out.exists()
        return
    (line,) = out.read_text().splitlines()
    run = json.loads(line)
    causes = run["causes"]
    assert causes["receiver: ours, wire.unpack (json.loads of a report)"][0] == 3 * items  # setup, call, teardown
    assert causes["main: ours, journal.write"][0] == items
    assert causes["main: ours, the items' costs from the dump"][0] == 1
    assert causes["main: ours, write_results (CSVs, JSON lines)"][0] == 1
    assert 0 < run["start_up_cpu"] <= run["process_cpu"] and 0 < run["main_thread_cpu"] <= run["process_cpu"] + 0.01
    assert all(cpu >= 0 for _, cpu in causes.values())
    monkeypatch.setattr("sys.argv", ["controller_probe.py", str(out)])
    main()
    assert "controller CPU" in capsys.readouterr().out
