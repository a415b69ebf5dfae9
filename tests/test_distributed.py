"""Large runs: device pool, xdist parity, crashes, timeouts, journal and resume, shards, baseline gate.

Runs that use xdist or kill processes go through `runpytest_subprocess`; -n 0 runs stay in-process
where nothing can take the test process down.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe import __main__ as cli
from pytest_msprobe.records.record import Record
from pytest_msprobe.reports.results import read_jsonl
from pytest_msprobe.session import baseline, devices, inflight, shard
from tests.helpers import EXAMPLES, copy_dump, device_side_conftest, make_dump, tensor

pytest.importorskip("xdist")

BF16_EXAMPLE = EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0"
TENSOR_EXAMPLE = EXAMPLES / "mlp_fp32_tensor" / "step0" / "rank0"
VOLATILE = ("timings", "duration_s")
# Subprocess runs skip plugins this file does not need (hypothesis' alone costs a second per process).
LEAN = ("-p", "no:hypothesispytest", "-p", "no:benchmark")
# These runs test xdist itself: start the workers even for dumps this small.
ALL_WORKERS = ("-o", "msprobe_min_work_per_worker=0")
XDIST = ("-n", "2", "-p", "xdist", *LEAN, *ALL_WORKERS)

# Corrupts the device's gelu result (inside the device call only) while PLANT_BUG is set: a failure
# that can be "fixed".
PLANTED_BUG = device_side_conftest("""
    import os
    import torch.nn.functional as F

    def gelu(orig, x, *a, **k):
        y = orig(x, *a, **k)
        return y * 1.05 if os.environ.get("PLANT_BUG") else y

    IMPLS = {F.gelu: gelu}
""")


def relu_dump(pytester: pytest.Pytester, count: int, name: str = "d") -> Path:
    entry = {"input_args": [tensor(shape=[4, 8])], "input_kwargs": {}, "output": [tensor(shape=[4, 8])]}
    return make_dump(pytester, {f"Functional.relu.{i}.forward": entry for i in range(count)}, name)


def gelu_dump(pytester: pytest.Pytester) -> Path:
    entry = {"input_args": [tensor(shape=[16, 16], mx=3.0, mn=0.5)], "input_kwargs": {},
             "output": [tensor(shape=[16, 16])]}
    relu = {"input_args": [tensor(shape=[4, 8])], "input_kwargs": {}, "output": [tensor(shape=[4, 8])]}
    return make_dump(pytester, {"Functional.relu.0.forward": relu, "Functional.gelu.0.forward": entry,
                                "Functional.relu.1.forward": relu})


def records(folder: Path) -> list[dict[str, Any]]:
    """The newest records file of a result folder."""
    return read_jsonl(sorted(folder.glob("msprobe_records_*.jsonl"))[-1])


def stable(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["nodeid"]: {k: v for k, v in r.items() if k not in VOLATILE} for r in recs}


def csv_rows(folder: Path, kind: str, dump: str = "") -> list[list[str]]:
    """The one CSV of that kind (of that dump's set, when the run had several dumps)."""
    (path,) = folder.glob(f"accuracy_checking_{kind}_*{'_' + dump if dump else ''}.csv")
    return list(csv.reader(path.open(encoding="utf-8-sig")))


def journal_lines(folder: Path) -> list[dict[str, Any]]:
    return read_jsonl(folder / "msprobe_journal.jsonl")


def journaled(folder: Path) -> int:
    """Records in the journal: one per item that ran (items taken from it are not written again)."""
    return sum("nodeid" in line for line in journal_lines(folder))


def ran(result: pytest.RunResult) -> int:
    """Items that ran and were judged (a Warning verdict is reported as 'warned', not 'passed')."""
    outcomes = result.parseoutcomes()
    return sum(outcomes.get(k, 0) for k in ("passed", "warned", "failed", "xfailed", "skipped"))


# --------------------------------------------------------------------------- device pool (no devices needed)


def test_pool_balances_devices_and_caps_each() -> None:
    pool = devices.DevicePool([3, 1], per_device=2)
    slots = [pool.acquire(f"gw{i}") for i in range(4)]
    assert [(s.device, s.k) for s in slots] == [(3, 0), (1, 0), (3, 1), (1, 1)]
    with pytest.raises(RuntimeError, match="all 4 device slots"):
        pool.acquire("gw4")


def test_replacement_worker_takes_the_dead_workers_slot() -> None:
    class Node:  # what xdist hands to pytest_configure_node / pytest_testnodedown
        def __init__(self, name: str) -> None:
            self.gateway = type("G", (), {"id": name})()
            self.workerinput: dict[str, Any] = {}

    hooks = devices.DeviceHooks(devices.DevicePool([0, 1], per_device=1))
    nodes = [Node("gw0"), Node("gw1")]
    for node in nodes:
        hooks.pytest_configure_node(node)
    hooks.pytest_testnodedown(nodes[1], error="crashed")   # xdist: node down, then a clone with a new name
    clone = Node("gw2")
    hooks.pytest_configure_node(clone)
    assert clone.workerinput[devices.WORKERINPUT_KEY] == nodes[1].workerinput[devices.WORKERINPUT_KEY] == [1, 0]
    assert hooks.summary() == "0: gw0; 1: gw1 gw2"


def test_device_ids_are_checked_and_index_into_the_callers_view(monkeypatch: pytest.MonkeyPatch) -> None:
    assert devices.parse_devices(["0,2", "5"]) == [0, 2, 5]
    for bad in (["x"], ["1", "1"]):
        with pytest.raises(pytest.UsageError):
            devices.parse_devices(bad)
    with pytest.raises(pytest.UsageError, match="shows only 2"):
        devices.check_visible([2], {"CUDA_VISIBLE_DEVICES": "4,5"})
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    assert devices.pin(devices.Slot(2, 0), env) == 2  # torch already imported here: select by index
    assert env == {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    monkeypatch.delitem(sys.modules, "torch")  # as in a fresh worker, before torch is imported
    assert devices.pin(devices.Slot(2, 0), env) == 0
    assert env == {"CUDA_VISIBLE_DEVICES": "6", "ASCEND_RT_VISIBLE_DEVICES": "2"}
    hidden = {"CUDA_VISIBLE_DEVICES": ""}  # GPUs hidden on purpose (e.g. on an NPU host) stay hidden
    devices.check_visible([3], hidden)
    assert devices.pin(devices.Slot(3, 1), hidden) == 0 and hidden == {"CUDA_VISIBLE_DEVICES": "",
                                                                       "ASCEND_RT_VISIBLE_DEVICES": "3"}


# --------------------------------------------------------------------------- xdist parity, crash, timeout


def test_xdist_on_pinned_workers_gives_the_same_seeds_verdicts_and_junit_properties(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest("""
        import os
        def pytest_runtest_call(item):
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(f"env_{worker}.txt", "w") as f:
                f.write(f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {os.environ.get('ASCEND_RT_VISIBLE_DEVICES')}")
    """)
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    pytester.runpytest(str(dump), "--msprobe-out", "serial", "--junitxml", "serial.xml")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")  # what -n auto finds, on any machine
    result = pytester.runpytest_subprocess(str(dump), "--msprobe-out", "parallel", "--junitxml", "parallel.xml",
                                           "-n", "auto", "-p", "xdist", *LEAN, *ALL_WORKERS, "--msprobe-devices", "1", "0",
                                           "-o", "msprobe_workers_per_device=1")
    # on a CPU-only machine the devices are accepted, pinned and reported; the items run on the CPU
    result.stdout.fnmatch_lines(["*msprobe: devices 1 0, at most 1 workers per device; 3 workers asked for, 2 started*",
                                 "*devices: 1: gw0; 0: gw1; items ran on cpu*"])
    assert sorted(p.read_text() for p in pytester.path.glob("env_gw*.txt")) == ["5 0", "7 1"]
    serial, parallel = stable(records(pytester.path / "serial")), stable(records(pytester.path / "parallel"))
    assert len(serial) == 18 and serial == parallel
    for name in ("serial.xml", "parallel.xml"):
        cases = ET.parse(pytester.path / name).getroot().iter("testcase")
        props = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")} for c in cases}
        linear = props["Functional.linear.0.forward"]
        rec = serial["bf16/dump.json::Functional.linear.0.forward"]
        assert linear["msprobe_status"] == rec["status"] and linear["msprobe_seed"] == str(rec["seed"])
        assert float(linear["msprobe_min_cosine"]) > 0.99 and "msprobe_max_abs_err" in linear


def test_crash_fails_one_item_and_keeps_every_other_result(pytester: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    pytester.runpytest(str(dump), "--msprobe-out", "clean")
    pytester.makeconftest("""
        import os
        def pytest_runtest_call(item):
            if item.name == "Functional.gelu.0.forward" and not os.environ.get("NO_CRASH"):
                os.abort()
    """)
    result = pytester.runpytest_subprocess(str(dump), *XDIST, "--msprobe-devices", "0", "1",
                                           "-o", "msprobe_workers_per_device=1")
    clean_errors = sum(r["status"] == "error" for r in records(pytester.path / "clean"))
    assert result.parseoutcomes()["failed"] == 1 + clean_errors and ran(result) == 18
    result.stdout.fnmatch_lines(["*worker crashed while running Functional.gelu.0.forward*",
                                 "*devices: *: gw? gw2;*"])  # the replacement took the dead worker's device
    crashed = stable(records(pytester.path / "msprobe_results"))
    clean = stable(records(pytester.path / "clean"))
    gelu = crashed.pop("bf16/dump.json::Functional.gelu.0.forward")
    assert gelu["status"] == "error" and "worker crashed while running" in gelu["message"]
    clean.pop("bf16/dump.json::Functional.gelu.0.forward")
    assert crashed == clean
    assert ["Functional.gelu.0", "error", "pass"] in csv_rows(pytester.path / "msprobe_results", "result")
    # a crash is not a finished result: resuming reruns exactly that item
    monkeypatch.setenv("NO_CRASH", "1")
    before = journaled(pytester.path / "msprobe_results")
    result = pytester.runpytest(str(dump), "--msprobe-resume")
    assert ran(result) == 18 and journaled(pytester.path / "msprobe_results") == before + 1  # gelu ran again
    result.stdout.fnmatch_lines(["*17 taken from the journal (--msprobe-resume)*"])
    assert len(records(pytester.path / "msprobe_results")) == 18


# Kills its worker as the kernel's out-of-memory killer does (SIGKILL: nothing reaches the controller), inside
# the device's gelu of a check whose estimate is a large part of its budget.
KILLED_IN_GELU = device_side_conftest("""
    import os, signal
    import torch.nn.functional as F

    def gelu(orig, x, *a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    IMPLS = {F.gelu: gelu}
""")


def test_a_worker_killed_in_a_large_check_fails_that_item_naming_its_estimate(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(KILLED_IN_GELU)
    big = {"input_args": [tensor(shape=[512, 1024])], "input_kwargs": {}, "output": [tensor(shape=[512, 1024])]}
    relu = {"input_args": [tensor(shape=[4, 8])], "input_kwargs": {}, "output": [tensor(shape=[4, 8])]}
    dump = make_dump(pytester, {"Functional.relu.0.forward": relu, "Functional.gelu.0.forward": big,
                                "Functional.relu.1.forward": relu})
    result = pytester.runpytest_subprocess(str(dump), *XDIST, "--msprobe-max-memory", "64MiB")
    result.assert_outcomes(failed=1, passed=2)  # the run goes on past the dead worker
    result.stdout.fnmatch_lines(["*worker crashed while running Functional.gelu.0.forward (worker gw? died); its "
                                 "check was estimated to need * MiB beside the device side, within a memory budget "
                                 "of 64 MiB (--msprobe-max-memory)*"])
    (gelu,) = [r for r in records(pytester.path / "msprobe_results") if r["api"] == "Functional.gelu.0"]
    assert gelu["status"] == "error" and gelu["crashed"] and "estimated to need" in gelu["message"]
    assert not list((pytester.path / "msprobe_results" / inflight.DIR_NAME).glob("*"))  # read and removed


def test_only_a_large_estimate_is_left_and_an_item_done_removes_it(tmp_path: Path) -> None:
    estimates = inflight.Estimates(tmp_path, "gw3", "d/dump.json::Functional.gelu.0.forward")
    estimates(1 << 20, 64 << 20)  # 1/64 of its budget: it cannot take the host's memory
    assert not (tmp_path / inflight.DIR_NAME).exists()
    estimates(16 << 20, 64 << 20)
    assert inflight.crash_note(tmp_path, "gw3", "d/dump.json::Functional.relu.0.forward") == ""  # another item
    estimates(16 << 20, 64 << 20)
    note = inflight.crash_note(tmp_path, "gw3", "d/dump.json::Functional.gelu.0.forward")
    assert "estimated to need 16 MiB beside the device side, within a memory budget of 64 MiB" in note
    estimates(16 << 20, 64 << 20)
    estimates.close()
    assert not (tmp_path / inflight.DIR_NAME).exists()  # nothing left in the results folder


def test_timeout_fails_a_hung_item_with_and_without_xdist(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest("""
        import os, signal, time
        def pytest_runtest_call(item):
            if item.name == "Functional.gelu.0.forward":
                if os.environ.get("MASK_ALARM"):  # like a native call that never returns to Python
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(120)
    """)
    dump = gelu_dump(pytester)
    started = time.monotonic()
    result = pytester.runpytest(str(dump), "-o", "msprobe_timeout=2")  # SIGALRM: the item fails, the run goes on
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["*timed out after 2 s (msprobe_timeout); it was here:*", "*time.sleep(120)*"])
    rec = {r["api"]: r for r in records(pytester.path / "msprobe_results")}["Functional.gelu.0"]
    assert rec["status"] == "error" and rec["message"].startswith("timed out after 2 s")
    monkeypatch.setenv("MASK_ALARM", "1")
    result = pytester.runpytest_subprocess(str(dump), "-o", "msprobe_timeout=2", *XDIST)
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(["*timed out after 2 s (msprobe_timeout): the watchdog stopped worker gw*"])
    assert time.monotonic() - started < 60


# --------------------------------------------------------------------------- journal, resume, --lf


def test_killed_run_resumes_to_exactly_one_result_per_item(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import time
        def pytest_runtest_call(item):
            time.sleep(0.03)
    """)
    total = 150
    dump = relu_dump(pytester, total)
    journal = pytester.path / "msprobe_results" / "msprobe_journal.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(dump), *XDIST, "-q", "-p", "no:cacheprovider"],
                            cwd=pytester.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.read_bytes().count(b"\n") > 30:
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not list((pytester.path / "msprobe_results").glob("msprobe_records_*")), "killed before the end"
    finished = {r["nodeid"] for r in journal_lines(pytester.path / "msprobe_results") if "nodeid" in r}
    assert 30 <= len(finished) < total
    result = pytester.runpytest_subprocess(str(dump), *XDIST, "--msprobe-resume")
    result.assert_outcomes(passed=total)  # the journaled items are reported with their results
    result.stdout.fnmatch_lines([f"*{len(finished)} taken from the journal (--msprobe-resume)*"])
    assert journaled(pytester.path / "msprobe_results") == total  # only the unfinished ones ran
    final = records(pytester.path / "msprobe_results")
    assert sorted(r["nodeid"] for r in final) == sorted(f"d/dump.json::Functional.relu.{i}.forward" for i in range(total))
    assert len(csv_rows(pytester.path / "msprobe_results", "result")) == total + 1


def test_resume_reruns_edited_entries_and_keeps_the_journal_seed(pytester: pytest.Pytester) -> None:
    dump = copy_dump(pytester, BF16_EXAMPLE, "bf16")
    assert ran(pytester.runpytest(str(dump), "--msprobe-seed", "77")) == 18
    first = stable(records(pytester.path / "msprobe_results"))
    doc = json.loads(dump.read_text())
    doc["data"]["Functional.gelu.0.forward"]["input_args"][0]["Max"] = 2.0  # edit a finished call
    dump.write_text(json.dumps(doc))
    before = journaled(pytester.path / "msprobe_results")
    result = pytester.runpytest(str(dump), "--msprobe-resume")
    # the edited forward entry reruns both gelu items (backward replays the forward call)
    assert ran(result) == 18 and journaled(pytester.path / "msprobe_results") == before + 2
    result.stdout.fnmatch_lines(["*16 taken from the journal (--msprobe-resume)*"])
    result.stdout.fnmatch_lines(["*msprobe: seed 77,*", "*resuming from*: 18 finished item(s) there*"])
    final = stable(records(pytester.path / "msprobe_results"))
    assert final.keys() == first.keys()
    changed = {k for k in final if final[k] != first[k]}
    assert changed == {"bf16/dump.json::Functional.gelu.0.forward", "bf16/dump.json::Functional.gelu.0.backward"}
    assert ran(pytester.runpytest(str(dump), "--msprobe-resume", "--msprobe-seed", "78")) == 18  # another seed


def test_lf_after_a_failure_reruns_only_the_failures(pytester: pytest.Pytester,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(PLANTED_BUG)
    monkeypatch.setenv("PLANT_BUG", "1")
    dump = gelu_dump(pytester)
    pytester.runpytest(str(dump)).assert_outcomes(failed=1, passed=2)
    result = pytester.runpytest_subprocess(str(dump), *XDIST, "--lf")
    result.assert_outcomes(failed=1)  # xdist's summary does not count the deselected items
    result.stdout.fnmatch_lines(["*2 workers [[]1 item[]]*"])
    assert [r["api"] for r in records(pytester.path / "msprobe_results")] == ["Functional.gelu.0"]


# --------------------------------------------------------------------------- shards and merge


def test_shard_assignment_is_balanced_and_deterministic() -> None:
    costs = [float(c) for c in (9, 1, 8, 2, 7, 3, 6, 4, 5, 5)]
    shards = shard.assign(costs, 3)
    assert shards == shard.assign(costs, 3)
    loads = [sum(c for c, s in zip(costs, shards) if s == k) for k in range(3)]
    assert max(loads) - min(loads) <= 1
    assert shard.parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "3", "a/b"):
        with pytest.raises(Exception, match="K/N"):
            shard.parse_shard(bad)


def test_shards_merged_equal_a_single_run(pytester: pytest.Pytester) -> None:
    dumps = [str(copy_dump(pytester, BF16_EXAMPLE, "a")), str(copy_dump(pytester, TENSOR_EXAMPLE, "b"))]
    pytester.runpytest(*dumps, "--msprobe-out", "single")
    sizes = []
    for k in (1, 2, 3):
        args = [*dumps, "--msprobe-shard", f"{k}/3", "--msprobe-out", f"shard{k}"]
        result = pytester.runpytest_subprocess(*args, *XDIST) if k == 2 else pytester.runpytest(*args)
        sizes.append(ran(result))
    assert sizes == [12, 12, 12]  # of 36 items
    assert cli.main(["merge", *(str(pytester.path / f"shard{k}") for k in (1, 2, 3)),
                     "-o", str(pytester.path / "merged")]) == 0
    single, merged = pytester.path / "single", pytester.path / "merged"
    assert stable(records(merged)) == stable(records(single))
    for kind in ("result", "details"):  # one set per dump, the same as a single run's
        assert len(list(merged.glob(f"accuracy_checking_{kind}_*.csv"))) == 2
        for dump in ("a", "b"):
            assert csv_rows(merged, kind, dump) == csv_rows(single, kind, dump)
    with pytest.raises(SystemExit, match="no msprobe_records"):
        cli.main(["merge", str(pytester.path / "a"), "-o", str(merged)])


# --------------------------------------------------------------------------- CI gate


def test_baseline_is_a_strict_xfail_both_ways(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(PLANTED_BUG)
    dump = gelu_dump(pytester)
    monkeypatch.setenv("PLANT_BUG", "1")
    result = pytester.runpytest(str(dump))
    result.assert_outcomes(failed=1, passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert cli.main(["baseline", str(pytester.path / "msprobe_results"), "-o", str(pytester.path / "bl.yaml")]) == 0
    entries = baseline.load(pytester.path / "bl.yaml")
    assert [e.api for e in entries] == ["Functional.gelu.0.forward"]
    result = pytester.runpytest(str(dump), "--msprobe-baseline", "bl.yaml")  # known failure: the gate is green
    result.assert_outcomes(xfailed=1, passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*1 known failure(s) xfailed by the baseline*"])
    monkeypatch.delenv("PLANT_BUG")  # the API is fixed: the gate turns red until the line is removed
    result = pytester.runpytest(str(dump), "--msprobe-baseline", "bl.yaml")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines([f"[[]XPASS(strict)] msprobe baseline: passes now; remove {entries[0].lines()} of bl.yaml "
                                 "(Functional.gelu.0.forward: TODO review: *"])
    (pytester.path / "bad.yaml").write_text("- api: '*relu*'\n")
    result = pytester.runpytest(str(dump), "--msprobe-baseline", "bad.yaml")
    result.stderr.fnmatch_lines(["*entry 0 needs a non-empty 'api' and 'reason'*"])


def test_baseline_patterns_match_node_id_entry_or_call_name() -> None:
    patterns = ["*/rank1/*", "Functional.linear.*", "Tensor.add_.3"]
    assert baseline.first_match(patterns, "s/rank1/dump.json::Torch.sum.0.forward") == 0
    assert baseline.first_match(patterns, "s/rank0/dump.json::Functional.linear.7.backward") == 1
    assert baseline.first_match(patterns, "s/rank0/dump.json::Tensor.add_.3.forward") == 2
    assert baseline.first_match(patterns, "s/rank0/dump.json::Tensor.add_.31.forward") is None
    assert re.search("TODO review", baseline.dump_yaml(baseline.failures([
        Record("A.b.0", "forward", 0, status="error", message="x"),
        Record("A.c.0", "forward", 0, status="Warning", message="y")])))


@pytest.mark.parametrize("args, message", [
    (("-o", "msprobe_threads=0"), "ini msprobe_threads: '0' is not a positive integer"),
    (("-o", "msprobe_timeout=-1"), "ini msprobe_timeout: '-1' is not a positive number of seconds"),
    (("--msprobe-devices", "0", "-o", "msprobe_workers_per_device=0"), "ini msprobe_workers_per_device: '0' is not*"),
    (("--msprobe-shard", "4/3"), "*--msprobe-shard wants K/N with 1 <= K <= N, got '4/3'"),
])
def test_bad_large_run_options_are_usage_errors(pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    result = pytester.runpytest(str(relu_dump(pytester, 1)), *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
