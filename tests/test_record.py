"""The typed record: its plain form read back gives the same JSON, key order included (the files and a resumed
journal depend on it), a wrong key is named, and a report's records cross the xdist wire typed on both ends."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_msprobe.records import wire
from pytest_msprobe.records.record import DropoutRow, OverflowRow, Record, Row

OPTIONAL = ("mode", "framework", "contract", "data", "reference", "layer1_status", "traceback", "nodeid", "dump",
            "order", "standard", "rerun", "item_id", "entry_key", "reused_from", "crashed", "repro")


def _row(kind: type[Row], name: str) -> Row:
    row = kind(name, "pass", "", "torch.float32", "torch.bfloat16", [4], {"cosine": 1.0})
    if kind is OverflowRow:
        row.overflow = {"device": "inf"}
    return row


@given(st.lists(st.sampled_from(OPTIONAL), unique=True), st.lists(st.sampled_from([Row, DropoutRow, OverflowRow])),
       st.booleans())
def test_the_plain_form_reads_back_to_the_same_json_in_the_same_order(keys: list[str], kinds: list[type[Row]],
                                                                     checked: bool) -> None:
    record = Record("Torch.add.0", "forward", 7, status="error", message="big", notes=["n"], timings={"a_s": 1.0})
    for i, key in enumerate(keys):  # in the order a check and the session would set them
        setattr(record, key, i if key == "order" else True if key == "crashed" else None if key == "traceback"
                else f"value {i}")
    record.outputs = [_row(kind, f"Torch.add.0.forward.output.{i}") for i, kind in enumerate(kinds)]
    if checked and record.outputs:
        record.outputs[0].check = "ties"
    text = json.dumps(record.to_dict())
    again = Record.from_dict(json.loads(text))
    assert json.dumps(again.to_dict()) == text
    assert [type(row) for row in again.outputs] == [type(row) for row in record.outputs]
    assert [key for key in OPTIONAL if again.has(key)] == [key for key in OPTIONAL if key in keys]


def test_a_copy_is_changed_apart() -> None:
    record = Record("Torch.add.0", "forward", 7, outputs=[_row(Row, "Torch.add.0.forward.output.0")])
    copy = record.copy()
    copy.notes.append("x")
    copy.outputs[0].name = "other"
    copy.nodeid = "d::Torch.add.0.forward"
    assert not record.notes and record.outputs[0].name == "Torch.add.0.forward.output.0"
    assert not record.has("nodeid") and copy.has("nodeid")


@pytest.mark.parametrize("data, message", [
    ({"api": "A.b.0", "direction": "forward", "seed": 0, "colour": "red"}, "a record has no field 'colour'"),
    ({"api": "A.b.0", "direction": "forward"}, "a record without 'seed'"),
    ({"api": "A.b.0", "direction": "forward", "seed": 0, "outputs": [{**_row(Row, "x").to_dict(), "hue": 1}]},
     "an output row has no field 'hue'"),
    ({"api": "A.b.0", "direction": "forward", "seed": 0, "outputs": [{"name": "x", "status": "pass"}]},
     "an output row without 'message'"),
])
def test_a_wrong_key_is_named(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Record.from_dict(data)


def test_optional_fields_given_to_the_constructor_are_keys() -> None:
    record = Record("A.b.0", "forward", 0, mode="replay", nodeid="d::A.b.0.forward")
    assert list(record.to_dict())[-2:] == ["mode", "nodeid"] and not record.has("framework")


def test_an_unknown_field_cannot_be_set() -> None:
    with pytest.raises(AttributeError, match="a record has no field 'colour'"):
        Record("A.b.0", "forward", 0).colour = "red"  # type: ignore[attr-defined]


class _Report:
    pass


def test_a_report_s_records_cross_the_wire_plain_and_arrive_typed() -> None:
    record = Record("A.b.0", "forward", 0, status="error", outputs=[_row(Row, "A.b.0.forward.output.0")])
    failing = Record("A.c.0", "forward", 0, status="error")
    data: dict[str, Any] = {wire.RECORD_ATTR: record, wire.FUZZ_ATTR: {"status": "error", "record": failing}}
    wire.plain_records(data)
    sent = json.loads(json.dumps(data))  # what JSON carries
    report = _Report()
    for key, value in sent.items():
        setattr(report, key, value)
    wire.typed_records(report)
    got = getattr(report, wire.RECORD_ATTR)
    assert isinstance(got, Record) and got.to_dict() == record.to_dict()
    fuzz = getattr(report, wire.FUZZ_ATTR)
    assert isinstance(fuzz["record"], Record) and fuzz["record"].to_dict() == failing.to_dict()
