"""The interface of the one check protocol (protocol.py): an item's context, the device source a mode supplies,
and the runs strategy its runs stage picks.

Apart from protocol.py (the sequence and the list of sources) so that each source's module (rerun.py, replay.py,
overflow.py) can subclass these without importing the list that names it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..dump.reader import Dump
from ..records.record import Record
from ..runs.execution import Shared
from ..runs.precision import Plan
from ..settings import CheckOptions
from . import calls
from .placement import Placement
from .precision import Inputs


@dataclass
class Item:
    """One entry's context, as every stage reads it: its name, settings and record, the inputs the sides may share
    (`shared`), then what each stage gives, in order: the entries (the user's settings, the recorded entries, the
    encoded arguments), the placement (`where`), the inputs as the device's kernel reads them and the precision
    plan. `bare`: the torch name the specs know the API by, where it is not the entry's own (a MindSpore call's
    torch twin)."""

    dump: Dump
    name: Any
    options: CheckOptions
    specs: dict[str, Any]
    record: Record
    shared: Shared | None = None
    user: dict[str, Any] = field(default_factory=dict)
    forward: dict[str, Any] = field(default_factory=dict)
    backward_entry: Any = None
    args_enc: list[Any] = field(default_factory=list)
    kwargs_enc: dict[str, Any] = field(default_factory=dict)
    bare: str = ""
    where: Placement = field(init=False)
    inputs: Inputs = field(init=False)
    plan: Plan = field(init=False)
    started: float = 0.0  # when the inputs stage began: the record's inputs_s

    @property
    def api(self) -> str:
        """The name the specs know the API by."""
        return self.bare or self.name.api_name

    @property
    def want_grad(self) -> bool:
        return self.backward_entry is not None

    @property
    def grad_index(self) -> int | None:
        return calls.grad_index(self.user, self.specs, self.api)


class RunsStrategy:
    """How an item's runs go and how their outputs are compared: the whole check at once (execute.Runs), a block
    of rows at a time (rerun.Pieces), the recorded outputs beside the bench (replay.py), an overflow run."""

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Around the runs and the comparison: what runs beside this thread is cancelled on a failure."""
        yield

    def run(self) -> Any:
        """The runs; what they gave, for `compare`."""
        raise NotImplementedError

    def compare(self, outputs: Any) -> None:
        """The record's output rows from what the runs gave."""
        raise NotImplementedError


class DeviceSource:
    """Where the device's result comes from (a mode), as the protocol's stages ask it. `applies`: whether this
    source checks the dump's items under these options; `mode`: the record's mode, set before every stage (None:
    the entries stage says); `retries`: whether an item whose call wrote into shared inputs is checked again."""

    mode: ClassVar[str | None] = None
    retries: ClassVar[bool] = True

    @classmethod
    def applies(cls, dump: Dump, options: CheckOptions) -> bool:
        raise NotImplementedError

    def item(self, dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any], record: Record,
             shared: Shared | None) -> Item:
        """The item's context before its stages."""
        return Item(dump, name, options, specs, record, shared)

    def entries(self, item: Item) -> None:
        """The entries the item checks; NotCheckable where it cannot be."""

    def placement(self, item: Item) -> None:
        """Where each side runs (or where the device's result comes from)."""

    def inputs(self, item: Item) -> None:
        """The item's arguments."""

    def precision(self, item: Item) -> None:
        """What each side computes in, and the inputs' rounding."""

    def runs(self, item: Item) -> RunsStrategy:
        """Which runs exist: the strategy that runs and compares them."""
        raise NotImplementedError

    def finish(self, item: Item) -> None:
        """The record stage: the item's statuses from its rows."""
        calls.finish_record(item.record)
