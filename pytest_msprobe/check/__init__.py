"""One dump entry through every stage into its record: inputs, the device and bench runs, the metrics
and the verdict. `check_entry` is the function every item, fuzz example, repro script and call script
runs. Three flows: rerun.py (the API runs again on the device under test), replay.py (the device
result is the output recorded in the dump, or MindSpore's run; recorded.py supplies it), overflow.py
(overflow_check dumps).

A re-run item's stages, each one call (rerun._run): entries -> placement.place (where the device side runs) ->
prepare.prepared_inputs -> precision.plan and precision.round_inputs (what each side computes in, the inputs'
rounding) -> placement.place_bench (where the bench computes) -> chunked.in_pieces (a check too large for its
memory budget: in pieces, or skipped) -> rerun.make_sides (placement: bench beside or here, shared inputs; precision: the bench's arguments)
-> execute.third_runs and execute.Runs.run (which runs exist: device, bench, third run, magnitude run; their
backward) -> rerun.compare_item -> compare.compare_outputs (how outputs are compared). calls.py holds the steps
every flow shares.
"""
from __future__ import annotations

from typing import Any

from ..dump.reader import Dump
from ..settings import CheckOptions
from . import rerun
from .overflow import run_overflow_check
from .replay import run_external


def check_entry(dump: Dump, entry_name: str, options: CheckOptions, specs: dict[str, Any]) -> dict[str, Any]:
    """The record of one entry (`Functional.relu.0.forward`), whichever flow the dump and options ask for."""
    return rerun.check_entry(dump, entry_name, options, specs, overflow=run_overflow_check, external=run_external)


__all__ = ["check_entry"]
