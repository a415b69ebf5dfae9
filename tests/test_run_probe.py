"""evals/probes/run_probe.py, the per-process probe behind `python -m benchmarks bench_phases`'s breakdown: every
process of a run writes its marks, in order, with its items and their phases, at -n 0 and -n 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from evals.probes.processes import breakdown, load_processes, print_steps

ROOT = Path(__file__).resolve().parents[1]
DUMP = ROOT / "examples" / "mlp_bf16_statistics" / "step0" / "rank0" / "dump.json"
ORDER = ("start", "probe_imported", "configured", "collected", "sessionfinish_start", "sessionfinish_done",
         "unconfigure_start", "unconfigure_done")


@pytest.mark.parametrize("workers", [0, 2])
def test_every_process_writes_its_marks_items_and_phases(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                         workers: int) -> None:
    if workers:
        pytest.importorskip("xdist")
    probe = pytester.path / "processes"
    probe.mkdir()
    monkeypatch.setenv("MSPROBE_RUN_PROBE_DIR", str(probe))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess(str(DUMP), "-p", "evals.probes.run_probe", "-p", "no:hypothesispytest",
                                           "-p", "no:benchmark", "--msprobe-device", "cpu", "-n", str(workers),
                                           "-o", "msprobe_min_work_per_worker=0", "--msprobe-out", "out")
    outcomes = result.parseoutcomes()
    items = outcomes.get("passed", 0) + outcomes.get("failed", 0)
    assert items > 0
    processes = load_processes(probe)
    assert sorted(processes) == (["main"] if workers == 0 else ["gw0", "gw1", "main"])
    runners = [p for name, p in processes.items() if workers == 0 or name != "main"]
    assert sum(p["counts"]["items"] for p in runners) == items
    for proc in processes.values():
        marks = proc["marks"]
        times = [marks[m][0] for m in ORDER if m in marks]
        assert len(times) == len(ORDER) and times == sorted(times)
        cpu = [marks[m][1] for m in ORDER[1:]]
        assert cpu == sorted(cpu) and cpu[-1] > 0
    for proc in runners:
        assert proc["marks"]["first_item"][0] <= proc["marks"]["torch_imported"][0] <= proc["marks"]["last_item_done"][0]
        assert proc["phases"]["device"] > 0 and proc["phases"]["compare"] > 0
        steps = {name: wall for name, wall, _ in breakdown(proc)}
        assert steps["items, all of the above"] >= sum(proc["phases"].values())
    if workers:
        counts = processes["main"]["counts"]
        assert counts["reports"] == 3 * items and counts["report_bytes"] > 0  # setup, call, teardown


def test_detail_times_each_items_steps(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """MSPROBE_RUN_PROBE_DETAIL=1 (bench_phases.py --detail): the items' thread's time per step, each step
    called as often as the run calls it, the steps inside an item's check within that check's time."""
    probe = pytester.path / "processes"
    probe.mkdir()
    monkeypatch.setenv("MSPROBE_RUN_PROBE_DIR", str(probe))
    monkeypatch.setenv("MSPROBE_RUN_PROBE_DETAIL", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess(str(DUMP), "-p", "evals.probes.run_probe", "-p", "no:hypothesispytest",
                                           "--msprobe-device", "cpu", "-n", "0", "--msprobe-out", "out")
    items = result.parseoutcomes().get("passed", 0)
    assert items > 0
    steps = load_processes(probe)["main"]["steps"]
    for step in ("check_entry", "hook: call (runtest)", "hook: setup", "hook: teardown", "journal entry_key",
                 "load_dump (item)"):
        assert steps[step][0] == items, step
    assert steps["hook: makereport"][0] == steps["hook: logreport"][0] == 3 * items
    assert steps["  compare_outputs (in compare_s)"][1] <= steps["check_entry"][1] <= steps["hook: call (runtest)"][1]
    # the package's own implementations of a hook, each call counted once, within that hook's time
    for ours, hook in (("  ours: makereport (msprobe)", "hook: makereport"),
                       ("  ours: logreport (msprobe-results)", "hook: logreport")):
        assert steps[ours][0] == 3 * items and steps[ours][1] <= steps[hook][1], ours
    assert steps["release_freed_memory"][0] == items
    assert steps.get("release_freed_memory: True", [0])[0] <= items  # the items after which the heap was trimmed
    assert all(calls >= 1 and 0 <= longest <= wall for calls, wall, _, longest in steps.values())


def test_print_steps_per_item_only_where_items_ran(capsys: pytest.CaptureFixture[str]) -> None:
    run = {"processes": {"main": {"counts": {"items": 0}, "steps": {"hook: logreport": [6, 0.003, 0.002, 0.001]}},
                         "gw0": {"counts": {"items": 2}, "steps": {"check_entry": [2, 0.004, 0.002, 0.003]}}}}
    print_steps(run)
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["check_entry"][1:] == ["2", "0.004", "0.002", "2.00", "0.003"]
    assert lines["hook:"][2:] == ["6", "0.003", "0.002", "-", "0.001"]
