"""The one sequence of stages every item's check takes, as pytest's runtestprotocol names setup, call and teardown:

    entries -> placement -> inputs -> precision -> runs -> compare -> record

A mode supplies only where the device's result comes from: a device source (source.DeviceSource), listed once in
SOURCES. Its runs stage picks a runs strategy (source.RunsStrategy): the whole check at once, or in pieces.
"""
from __future__ import annotations

import traceback
from typing import Any

from ..dump.reader import Dump, parse_entry_name
from ..inputs.build import InputError
from ..inputs.seeds import item_seed
from ..records.record import Record
from ..runs import kernels
from ..runs.backends import not_implemented
from ..runs.execution import NotCheckable, Shared
from ..settings import CheckOptions
from .calls import ApiFailure
from .overflow import OverflowRun
from .replay import MindSporeRerun, RecordedOutputs
from .rerun import TorchRerun
from .source import DeviceSource, Item

STAGES = ("entries", "placement", "inputs", "precision", "runs", "compare", "record")
# the first that applies: an overflow_check dump, recorded outputs, MindSpore running the call, torch re-running it
SOURCES: tuple[type[DeviceSource], ...] = (OverflowRun, RecordedOutputs, MindSporeRerun, TorchRerun)


def source_for(dump: Dump, options: CheckOptions) -> DeviceSource:
    """The device source of a dump's items under these options."""
    return next(source for source in SOURCES if source.applies(dump, options))()


def check_entry(dump: Dump, entry_name: str, options: CheckOptions, specs: dict[str, Any]) -> Record:
    """One entry's record. The inputs the call may not write are shared by the sides (placement.share); if the call
    wrote into one after all, the item is checked again on fresh inputs, with a copy of every input per side."""
    name = parse_entry_name(entry_name)
    source = source_for(dump, options)
    # a loop, not a helper function: a frame more would make a dump nested near Python's recursion limit fail
    note = ""
    for shared in (Shared(None), None) if source.retries else (None,):
        record = Record(name.full_name, name.direction, item_seed(options.run_seed, name.full_name))
        if source.mode is not None:
            record.mode = source.mode
        try:
            run_item(source, source.item(dump, name, options, specs, record, shared))
        except (NotCheckable, InputError) as exc:
            record.status, record.message = "SKIP", str(exc)
        except (ApiFailure, kernels.KernelError) as exc:
            record.status, record.message = "error", str(exc)
            record.traceback = None if exc.__cause__ is None else "".join(traceback.format_exception(exc.__cause__))
            if isinstance(exc, ApiFailure) and exc.side == "device" and not_implemented(exc.__cause__):
                # a device without a kernel for this call (or dtype) says nothing about its accuracy: counted apart
                record.status, record.not_implemented = "SKIP", True
                record.message = f"not implemented on the device: {exc}"
        except Exception:
            if shared is None or not shared.changed():
                raise
        written = shared.changed() if shared is not None else []
        if not written:
            break
        note = (f"the call wrote into {len(written)} input(s) that another side read (torch's version counter "
                "moved): checked again with a copy of every input per side")
    if note:
        record.notes.append(note)
    return record


def run_item(source: DeviceSource, item: Item) -> None:
    """The stages, in order, each one call: the record is final once the runs beside this thread are done."""
    source.entries(item)
    source.placement(item)
    source.inputs(item)
    source.precision(item)
    runs = source.runs(item)
    with runs.guarded():
        runs.compare(runs.run())
        source.finish(item)
