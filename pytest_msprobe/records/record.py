"""The record of one item's check and its output rows, typed from the check through the session and the reports;
`to_dict` gives the plain JSON form, and `Record.from_dict` reads it back, only where a record crosses the xdist
wire or a file (the records JSONL, a resumed journal, the in-process check's queue).

A record's plain form holds its optional keys in the order the check first set them (a mode sets its own), and
only those it set: `Record` keeps that order, so the JSON stays what a dict filled key by key would be. Each kind
of output row has its own key set (`Row`, `DropoutRow`, `OverflowRow`). Torch- and numpy-free.
"""
from __future__ import annotations

import copy
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

# the keys every record has, in this order; the optional ones follow in the order they were first set
_ALWAYS = ("api", "direction", "status", "message", "seed", "device", "impl", "notes", "outputs", "timings")


@dataclass
class Row:
    """One output's row (a details-CSV row): a float pair's, as verdict.standards.OutputComparison.to_dict gives
    it. `ms_metrics` (a MindSpore dump's) and `check` (a row judged again by validity) are keys only once set."""

    KEYS: ClassVar[tuple[str, ...]] = ("name", "status", "message", "bench_dtype", "device_dtype", "shape", "metrics",
                                       "worst", "algorithm", "verdict", "verdict_message", "compare", "reference")

    name: str
    status: str
    message: str
    bench_dtype: str
    device_dtype: str
    shape: list[int] | None
    metrics: dict[str, Any]
    worst: dict[str, Any] | None = None
    algorithm: str | None = None
    verdict: str | None = None
    verdict_message: str = ""
    compare: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    overflow: dict[str, Any] | None = None
    ms_metrics: dict[str, Any] | None = None
    check: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row's plain form: its kind's keys, then the extras that were set."""
        data = {key: getattr(self, key) for key in self.KEYS}
        for key in _ROW_EXTRAS:
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Row:
        """The row of a plain form: its kind told by its keys (an overflow row's classification, a dropout row's
        missing Layer-2 columns); ValueError naming a key no kind has."""
        kind = OverflowRow if "overflow" in data else Row if "algorithm" in data else DropoutRow
        unknown = [key for key in data if key not in kind.KEYS and key not in _ROW_EXTRAS]
        missing = [key for key in _ROW_REQUIRED if key not in data]
        if unknown or missing:
            raise ValueError(f"an output row has no field {unknown[0]!r}" if unknown else
                             f"an output row without {missing[0]!r}")
        return kind(**data)


@dataclass
class DropoutRow(Row):
    """A dropout's row, judged by its fraction of zeros: no Layer-2 columns."""

    KEYS: ClassVar[tuple[str, ...]] = ("name", "status", "message", "bench_dtype", "device_dtype", "shape", "metrics",
                                       "worst", "verdict")


@dataclass
class OverflowRow(Row):
    """An overflow_check dump's row: the overflow classification instead of a precision verdict."""

    KEYS: ClassVar[tuple[str, ...]] = ("name", "status", "message", "bench_dtype", "device_dtype", "shape", "metrics",
                                       "worst", "verdict", "verdict_message", "overflow")


@dataclass
class Record:
    """One item's record while the check fills it. The optional fields are keys of the plain form once set (to
    any value, None included: an error's traceback may be None)."""

    api: str
    direction: str
    seed: int
    status: str = "SKIP"
    message: str = ""
    device: str = ""
    impl: str = ""
    notes: list[str] = field(default_factory=list)
    outputs: list[Row] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    mode: str | None = None
    framework: str | None = None
    bench_device: str | None = None
    backend: str | None = None
    contract: str | None = None
    kernel: str | None = None
    reference_only: bool | None = None
    data: str | None = None
    reference: str | None = None
    pieces: dict[str, Any] | None = None
    layer1_status: str | None = None
    overflow: str | None = None
    traceback: str | None = None
    not_implemented: bool | None = None
    # set by the session around the check: the item, its dump, how to run it again, what triage saved of it
    nodeid: str | None = None
    dump: str | None = None
    order: int | None = None
    standard: str | None = None
    rerun: str | None = None
    item_id: str | None = None
    entry_key: str | None = None
    reused_from: str | None = None
    not_checked: bool | None = None
    crashed: bool | None = None
    fuzz: bool | None = None
    error_data: dict[str, Any] | None = None
    repro: str | None = None
    error_summary: list[dict[str, Any]] | None = None
    _set: list[str] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Optional fields given to the constructor are set, in the order of the fields."""
        self._set.extend(f.name for f in fields(self) if f.name not in _ALWAYS and f.init and f.default is None
                         and getattr(self, f.name) is not None)

    def __setattr__(self, key: str, value: Any) -> None:
        if key not in _NAMES:
            raise AttributeError(f"a record has no field {key!r}")
        if key not in _ALWAYS and key != "_set" and "_set" in self.__dict__ and key not in self._set:
            self._set.append(key)  # past __init__, which sets `_set` last
        object.__setattr__(self, key, value)

    def has(self, key: str) -> bool:
        """Whether an optional key was set (a key of the plain form)."""
        return key in _ALWAYS or key in self._set

    def to_dict(self) -> dict[str, Any]:
        """The plain JSON form: the keys every record has, then the optional ones in the order they were set."""
        data: dict[str, Any] = {key: getattr(self, key) for key in _ALWAYS}
        data["outputs"] = [row.to_dict() for row in self.outputs]
        for key in self._set:
            data[key] = getattr(self, key)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """The record of a plain form, its optional keys set in the form's order (so `to_dict` gives it back);
        ValueError naming a missing or unknown key."""
        missing = [key for key in ("api", "direction", "seed") if key not in data]
        unknown = [key for key in data if key not in _NAMES or key == "_set"]
        if missing or unknown:
            raise ValueError(f"a record has no field {unknown[0]!r}" if unknown else
                             f"a record without {missing[0]!r}")
        record = cls(data["api"], data["direction"], data["seed"])
        for key, value in data.items():
            if key == "outputs":
                value = [Row.from_dict(row) for row in value]
            if key not in ("api", "direction", "seed"):
                setattr(record, key, value)
        return record

    def copy(self) -> Record:
        """A copy to change apart: its own notes, rows and their values, and its own set of keys."""
        return Record.from_dict(copy.deepcopy(self.to_dict()))


_NAMES = frozenset(f.name for f in fields(Record))
_ROW_EXTRAS = ("ms_metrics", "check")
_ROW_REQUIRED = tuple(f.name for f in fields(Row) if f.default is MISSING and f.default_factory is MISSING)

__all__ = ["DropoutRow", "OverflowRow", "Record", "Row"]
