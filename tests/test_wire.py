"""Reports packed into one JSON string on xdist workers come back as the same TestReport."""
from __future__ import annotations

import math

import pytest

from pytest_msprobe.records import wire
from pytest_msprobe.records.record import Record, Row


def _report(**changes: object) -> pytest.TestReport:
    fields = dict(nodeid="d/dump.json::Torch.add.0.forward", location=("d/dump.json", 0, "msprobe: Torch.add.0.forward"),
                  keywords={"Torch.add.0.forward": 1, "msprobe": 1, "Torch": 1}, outcome="passed", longrepr=None,
                  when="call", user_properties=[("msprobe_status", "pass"), ("msprobe_seed", 7)],
                  sections=[("Captured stdout call", "hello\n")], duration=0.25, start=1.0, stop=1.25)
    fields.update(changes)
    report = pytest.TestReport(**fields)  # type: ignore[arg-type]
    report.msprobe = Record("Torch.add.0", "forward", 7, status="pass", outputs=[
        Row("Torch.add.0.forward.output.0", "pass", "", "torch.float32", "torch.float16", [2], {"cosine": math.nan})])
    return report


def _round_trip(config: pytest.Config, report: pytest.TestReport) -> tuple[dict, pytest.TestReport]:
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    packed = data if wire.PACKED_KEY in data else wire.pack(data)  # an xdist worker's hook packed it already
    packed["item_index"] = 3  # what xdist adds after the hook
    back = config.hook.pytest_report_from_serializable(config=config, data=dict(packed))
    return packed, back


@pytest.mark.parametrize("changes", [
    {},
    {"outcome": "failed", "longrepr": "Torch.add.0.forward: error\nmax abs error 3"},
    {"outcome": "skipped", "longrepr": ("d/dump.json", 0, "Skipped: no bench function")},
])
def test_pack_round_trip(pytestconfig: pytest.Config, changes: dict) -> None:
    report = _report(**changes)
    packed, back = _round_trip(pytestconfig, report)
    assert set(packed) == {"$report_type", wire.PACKED_KEY, "item_index"}  # one string on the wire
    for name in ("nodeid", "location", "keywords", "outcome", "when", "user_properties", "sections", "duration",
                 "longrepr"):
        assert getattr(back, name) == getattr(report, name), name
    assert isinstance(back.location, tuple) and all(isinstance(p, tuple) for p in back.user_properties)
    assert back.item_index == 3
    assert isinstance(back.msprobe, Record) and back.msprobe.api == "Torch.add.0"
    assert math.isnan(back.msprobe.outputs[0].metrics["cosine"])


def test_structured_tracebacks_and_foreign_objects_travel_unpacked(pytestconfig: pytest.Config) -> None:
    data = pytestconfig.hook.pytest_report_to_serializable(config=pytestconfig, report=_report())
    traceback = dict(data, longrepr={"reprcrash": {"path": "x", "lineno": 1, "message": "boom"}})
    assert wire.pack(traceback) is traceback
    foreign = dict(data, other_plugin=object())
    assert wire.pack(foreign) is foreign
    collect = {"$report_type": "CollectReport", "nodeid": "x"}
    assert wire.pack(collect) is collect and wire.unpack(collect) is None
