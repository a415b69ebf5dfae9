"""msprobe_filter_api: one check per group of identical calls; the others report it, marked as reused."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.dump import dedup
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.records.record import Record, Row
from tests.helpers import make_dump, records, tensor

# msprobe's standard: the conftest's gelu bug is global, and these tests count device and bench calls
# (strict's torch run would call gelu a third time, and see the bug too)
LEAN = ("--msprobe-standard", "msprobe", "-p", "no:hypothesispytest", "-p", "no:benchmark")
ALL_WORKERS = ("-o", "msprobe_min_work_per_worker=0")  # a dump this small would otherwise run in one process

# The device side of gelu is 5% off (fp32 outputs; the bench is fp64), and every gelu call of a
# process is counted into calls.txt at exit: one check = one device call + one bench call.
COUNTING_GELU = """
import torch
import torch.nn.functional as F
_gelu = F.gelu
CALLS = [0]
def gelu(x, *a, **k):
    CALLS[0] += 1
    y = _gelu(x, *a, **k)
    return y * 1.05 if y.dtype == torch.float32 else y
F.gelu = gelu
def pytest_unconfigure(config):
    F.gelu = _gelu
    with open(config.rootpath / "calls.txt", "a") as fh:
        fh.write(f"{CALLS[0]}\\n")
"""


def call(api_args: list[Any], kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"input_args": api_args, "input_kwargs": kwargs or {}, "output": [tensor(shape=[8, 8])]}


def x(**kw: Any) -> dict[str, Any]:
    return tensor(shape=kw.pop("shape", [8, 8]), mx=kw.pop("mx", 3.0), mn=kw.pop("mn", 0.5), requires_grad=True, **kw)


def grad(**kw: Any) -> dict[str, Any]:
    return {"input": [tensor(shape=[8, 8], **kw)], "output": [tensor(shape=[8, 8])]}


def dump_data() -> dict[str, Any]:
    return {
        "Functional.gelu.0.forward": call([x()]),
        "Functional.gelu.0.backward": grad(),
        "Functional.gelu.1.forward": call([x()]),
        "Functional.gelu.1.backward": grad(),                       # same gradient: reused
        "Functional.gelu.2.forward": call([x(mx=2.5, mn=0.25)]),     # Max/Min differ: still identical
        "Functional.gelu.2.backward": grad(Mean=0.5),               # another gradient: checked
        "Functional.gelu.3.forward": call([x(Mean=0.25)]),          # Mean differs: checked
        "Functional.relu.0.forward": call([x()]),                   # another API: checked
    }


def test_groups_follow_msprobes_rule_with_lists_compared(write_dump) -> None:
    data = {
        "Torch.add.0.forward": call([x(), 1.0], {"alpha": 2}),
        "Torch.add.1.forward": call([x(mx=9.0, mn=-9.0), 1.0], {"alpha": 2}),  # Max/Min of args ignored
        "Torch.add.2.forward": call([x(), 1.0], {"alpha": 3}),                 # kwargs compared
        "Torch.add.3.forward": call([x(), 2.0]),                               # scalar args compared
        "Torch.cat.0.forward": call([[x(shape=[2, 8]), x(shape=[6, 8])]]),
        "Torch.cat.1.forward": call([[x(shape=[4, 8]), x(shape=[4, 8])]]),    # msprobe would drop the list
        "Torch.cat.2.forward": call([[x(shape=[2, 8], mx=1.0), x(shape=[6, 8])]]),
        "Torch.add.4.forward": call([x(data_name="a.pt"), 1.0], {"alpha": 2}),  # other saved tensor
    }
    dump = load_dump(write_dump(data))
    found = dedup.groups(dump, dump.entry_names())
    assert set(found) == {"Torch.add.0.forward", "Torch.add.1.forward", "Torch.cat.0.forward", "Torch.cat.2.forward"}
    assert found["Torch.add.1.forward"][1] == "Torch.add.0.forward"
    assert found["Torch.cat.2.forward"][1] == "Torch.cat.0.forward"
    assert found["Torch.add.0.forward"][0] != found["Torch.cat.0.forward"][0]


def test_reused_record_names_its_source_in_every_message() -> None:
    record = Record("Torch.add.0", "forward", 1, status="error", timings={"device_s": 1.0},
                    outputs=[Row("Torch.add.0.forward.output.0", "error", "big", "torch.float32", "torch.float16", [2],
                                 {})])
    copy = dedup.reused_record(record, "Torch.add.0.forward", "Torch.add.7.forward")
    assert copy.api == "Torch.add.7" and copy.reused_from == "Torch.add.0.forward" and copy.timings == {}
    assert copy.outputs[0].name == "Torch.add.7.forward.output.0"
    assert copy.outputs[0].message.startswith("[reused: identical to Torch.add.0.forward")
    assert "Torch.add.0.forward" in copy.message
    assert record.outputs[0].name == "Torch.add.0.forward.output.0"  # the source is left alone
    assert record.timings == {"device_s": 1.0} and not record.has("reused_from")


@pytest.mark.parametrize("workers", [0, 2])
def test_filter_api_checks_each_group_once_and_marks_the_rest(pytester: pytest.Pytester, workers: int) -> None:
    if workers:
        pytest.importorskip("xdist")
    pytester.makeconftest(COUNTING_GELU)
    dump = make_dump(pytester, dump_data())
    args = [str(dump), "-o", "msprobe_filter_api=true", "-v", "-rA", "--junitxml", "junit.xml", *LEAN]
    result = pytester.runpytest_subprocess(*args, "-n", str(workers), "-p", "xdist", *ALL_WORKERS) if workers else \
        pytester.runpytest_subprocess(*args)
    recs = {f"{r['api']}.{r['direction']}": r for r in records(pytester)}
    reused = {name: r["reused_from"] for name, r in recs.items() if r.get("reused_from")}
    assert reused == {"Functional.gelu.1.forward": "Functional.gelu.0.forward",
                      "Functional.gelu.2.forward": "Functional.gelu.0.forward",
                      "Functional.gelu.1.backward": "Functional.gelu.0.backward"}
    for name, source in reused.items():
        # the result is the source's own check: its seed, its verdict, nothing ran for this item
        assert recs[name]["seed"] == recs[source]["seed"] and recs[name]["status"] == recs[source]["status"]
        assert recs[name]["timings"] == {} and recs[source]["timings"]
        assert recs[name]["outputs"][0]["name"].startswith(name.rsplit(".", 1)[0])
    assert recs["Functional.gelu.3.forward"]["seed"] != recs["Functional.gelu.0.forward"]["seed"]
    assert recs["Functional.gelu.1.forward"]["status"] == "error"  # a reused failure still fails
    result.assert_outcomes(failed=7, passed=1)
    result.stdout.fnmatch_lines(["*message: reused: identical to Functional.gelu.0.forward*",
                                 "*3 reused the result of an identical call (msprobe_filter_api)*",
                                 "FAILED (reused) d/dump.json::Functional.gelu.1.forward*"])
    result.stdout.fnmatch_lines(["PASSED d/dump.json::Functional.relu.0.forward"])
    junit = (pytester.path / "junit.xml").read_text()
    assert '<property name="msprobe_reused_from" value="Functional.gelu.0.forward"' in junit
    (details,) = (pytester.path / "msprobe_results").glob("accuracy_checking_details_*.csv")
    rows = {row[0]: row[-1] for row in csv.reader(details.open(encoding="utf-8-sig"))}
    assert rows["Functional.gelu.2.forward.output.0"].startswith("[reused: identical to Functional.gelu.0.forward")
    assert "reused" not in rows["Functional.gelu.0.forward.output.0"]
    # each check calls gelu once on the device and once on the bench; without the option the 7 gelu
    # items make 7 checks (next test), with it 4, under xdist too (a group runs on one worker)
    calls = sum(int(n) for n in (pytester.path / "calls.txt").read_text().split())
    checks_needed = 4  # gelu.0.forward, gelu.3.forward, gelu.0.backward, gelu.2.backward
    assert calls == 2 * checks_needed


def test_without_the_option_every_call_runs(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(COUNTING_GELU)
    dump = make_dump(pytester, dump_data())
    pytester.runpytest_subprocess(str(dump), *LEAN).assert_outcomes(failed=7, passed=1)
    assert not [r for r in records(pytester) if r.get("reused_from")]
    assert sum(int(n) for n in Path(pytester.path / "calls.txt").read_text().split()) == 2 * 7
