"""Test reports from xdist workers to the controller as one JSON string each.

xdist sends a report as a nested dict through execnet's serializer, which walks every key, tuple and
string in Python on both sides (about 0.3 ms a report each way here, three reports per item); the
controller's receiving thread is the bottleneck of a run of many small calls. A worker therefore
hands execnet one string (json.dumps in C), and the controller rebuilds the same dict before pytest
turns it into a TestReport. Reports that JSON cannot carry exactly (another plugin's objects, or a
structured traceback) travel the usual way. Torch-free; the hooks in plugin.py call it.
"""
from __future__ import annotations

import json
from typing import Any

from .record import Record

PACKED_KEY = "msprobe_packed"
RECORD_ATTR, FUZZ_ATTR = "msprobe", "msprobe_fuzz"  # a report's record, and a [fuzz] item's result holding one
_TUPLE_LISTS = ("user_properties", "sections")  # lists of tuples, which JSON turns into lists


def pack(data: dict[str, Any]) -> dict[str, Any]:
    """A worker's serialized TestReport as {"$report_type", PACKED_KEY: json}; other data unchanged."""
    if data.get("$report_type") != "TestReport" or PACKED_KEY in data:
        return data
    longrepr = data.get("longrepr")
    if not (longrepr is None or isinstance(longrepr, str) or _is_skip_location(longrepr)):
        return data  # a structured traceback: its nested tuples go the usual way
    try:
        text = json.dumps(data, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError):  # something JSON cannot hold (a plugin's object, a circular value)
        return data
    return {"$report_type": "TestReport", PACKED_KEY: text}


def unpack(data: dict[str, Any]) -> dict[str, Any] | None:
    """The dict `pack` was given (plus what xdist added on the way), or None for unpacked data."""
    text = data.get(PACKED_KEY)
    if not isinstance(text, str):
        return None
    report: dict[str, Any] = json.loads(text)
    for key, value in data.items():  # xdist adds item_index, worker_id, testrun_uid after packing
        if key != PACKED_KEY:
            report[key] = value
    if isinstance(report.get("location"), list):
        report["location"] = tuple(report["location"])
    for key in _TUPLE_LISTS:
        if isinstance(report.get(key), list):
            report[key] = [tuple(x) if isinstance(x, list) else x for x in report[key]]
    if isinstance(report.get("longrepr"), list):
        report["longrepr"] = tuple(report["longrepr"])
    return report


def _is_skip_location(value: Any) -> bool:
    """A skip's longrepr: (path, lineno, reason)."""
    return isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str) and isinstance(value[2], str) \
        and (value[1] is None or isinstance(value[1], int))


def plain_records(data: dict[str, Any]) -> None:
    """A serialized report's records in their JSON form: its own, and the one a [fuzz] item's result holds."""
    if isinstance(data.get(RECORD_ATTR), Record):
        data[RECORD_ATTR] = data[RECORD_ATTR].to_dict()
    if isinstance(data.get(FUZZ_ATTR), dict):
        data[FUZZ_ATTR] = plain_fuzz(data[FUZZ_ATTR])


def typed_records(report: Any) -> None:
    """A report rebuilt on the controller: its records typed again (what `plain_records` made plain)."""
    if isinstance(getattr(report, RECORD_ATTR, None), dict):
        setattr(report, RECORD_ATTR, Record.from_dict(getattr(report, RECORD_ATTR)))
    if isinstance(getattr(report, FUZZ_ATTR, None), dict):
        setattr(report, FUZZ_ATTR, typed_fuzz(getattr(report, FUZZ_ATTR)))


def plain_fuzz(result: dict[str, Any]) -> dict[str, Any]:
    """A [fuzz] item's result with its failing example's record in the JSON form."""
    record = result.get("record")
    return dict(result, record=record.to_dict()) if isinstance(record, Record) else result


def typed_fuzz(result: dict[str, Any]) -> dict[str, Any]:
    """A [fuzz] item's result with its failing example's record typed."""
    record = result.get("record")
    return dict(result, record=Record.from_dict(record)) if isinstance(record, dict) else result
