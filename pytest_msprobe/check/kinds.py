"""Each kind of output compares itself, as torch.testing's comparison makes each kind of input a `Pair`: float pairs
(msprobe's metrics and the selected standard), a dropout's output (the fraction of zeros), MindSpore's outputs (float
pairs with its checker's metrics), outputs the dump did not save (SKIP rows), outputs that are not unique (judged
again by validity). `kinds_for` picks the kinds once from the specs and the outputs; `compare_outputs` knows none of
them. KINDS lists them; a new kind of output is one class.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..metrics.vectorised import blank_metrics
from ..runs import capture
from ..runs.execution import NotCheckable
from ..settings import CheckOptions
from ..verdict import ms_results, standards
from . import compare
from .compare import EarlyMetrics
from .recorded import Unsaved
from .unique import judge_by_validity


@dataclass
class Comparison:
    """A flat declaration of what one comparison of an item's outputs reads: the record, the rows' prefix, the
    bench's, device's and third run's outputs and the third run's role, the API and settings; then what
    compare.compare_floats reads (see there), and `ms_format` (a MindSpore dump: its checker's metrics on each row),
    `validity` (a forward item's outputs may not be unique: the API as api_specs' not_unique lists name it, and
    the device side's args and kwargs)."""

    record: dict[str, Any]
    prefix: str
    bench: list[Any]
    device: list[Any]
    third: list[Any] | None
    role: str
    api: str
    specs: dict[str, Any]
    options: CheckOptions
    positions: list[int] | None = None
    product: Any = None
    autocast: torch.dtype | None = None
    scalar_operand: bool = False
    gradients: bool = False
    estimated: list[Any] | None = None
    early: EarlyMetrics | None = None
    contract: str = "torch"
    summed: tuple[list[Any], str] | None = None
    ms_format: bool = False
    validity: tuple[str, list[Any], dict[str, Any]] | None = None


class Kind:
    """One kind of output: the pairs at `indices` of a comparison (None: all of them, as they are)."""

    def __init__(self, indices: list[int] | None) -> None:
        self.indices = indices

    def applies(self, job: Comparison) -> bool:
        return True

    def pick(self, values: list[Any] | None) -> list[Any] | None:
        """These pairs' values of a per-pair list (None stays None)."""
        if values is None or self.indices is None:
            return values
        return [values[i] for i in self.indices]

    def compare(self, job: Comparison) -> None:
        raise NotImplementedError


class FloatPairs(Kind):
    """msprobe's metrics and the selected standard's verdict on each pair (compare.compare_floats)."""

    def compare(self, job: Comparison) -> None:
        summed = job.summed
        compare.compare_floats(job.record, job.prefix, self.pick(job.bench) or [], self.pick(job.device) or [],
                               self.pick(job.third), job.role, job.api, job.specs, job.options, self.pick(job.positions),
                               product=job.product, autocast=job.autocast, scalar_operand=job.scalar_operand,
                               gradients=job.gradients, estimated=self.pick(job.estimated), early=job.early,
                               contract=job.contract,
                               summed=None if summed is None else (self.pick(summed[0]) or [], summed[1]))


class Dropout(Kind):
    """A dropout's output judged by the fraction of zeros (msprobe's rule), not by values."""

    def applies(self, job: Comparison) -> bool:
        return job.api in job.specs.get("dropout_apis", [])

    def compare(self, job: Comparison) -> None:
        bench, device = self.pick(job.bench) or [], self.pick(job.device) or []
        capture.stash(compared_bench=bench, compared_device=device, positions=self.pick(job.positions))
        b = next((x for x in bench if isinstance(x, torch.Tensor)), None)
        d = next((x for x in device if isinstance(x, torch.Tensor)), None)
        if b is None or d is None:
            raise NotCheckable(f"{job.api}: dropout produced no tensor to judge")
        status, message = standards.dropout_verdict(compare.to_numpy(b)[1], compare.to_numpy(d)[1], job.specs)
        job.record["outputs"].append({
            "name": f"{job.prefix}.0", "status": status, "message": message, "bench_dtype": str(b.dtype),
            "device_dtype": str(d.dtype), "shape": list(d.shape), "metrics": {}, "worst": None, "verdict": None,
        })
        job.record["notes"].append("dropout: judged by the fraction of zeros (msprobe's rule), not by values")


class MindSporeMetrics(Kind):
    """Another kind's rows of a MindSpore dump, each with the MindSpore checker's metrics (its CSV columns)."""

    def __init__(self, indices: list[int] | None, inner: Kind) -> None:
        super().__init__(indices)
        self.inner = inner

    def applies(self, job: Comparison) -> bool:
        return job.ms_format

    def compare(self, job: Comparison) -> None:
        start = len(job.record["outputs"])
        self.inner.compare(job)
        rows, bench, device = job.record["outputs"][start:], self.pick(job.bench) or [], self.pick(job.device) or []
        if len(rows) != len(device):
            return
        epsilon = job.specs["thresholds"]["mindspore"]["epsilon"]
        for row, b_value, d_value in zip(rows, bench, device):
            b, d = compare.to_numpy(b_value), compare.to_numpy(d_value)
            if b[0] == "tensor" and d[0] == "tensor":
                row["ms_metrics"] = ms_results.ms_metrics(b[1], d[1], epsilon)


class NotSaved(Kind):
    """Recorded outputs the dump has no file for: a SKIP row each, never compared."""

    def compare(self, job: Comparison) -> None:
        for i, d in zip(self.indices or [], self.pick(job.device) or []):
            position = job.positions[i] if job.positions is not None else i
            row = standards.OutputComparison(f"{job.prefix}.{position}", "SKIP", f"{d.where}: not saved in "
                                             "dump_tensor_data/, nothing to compare", " ", " ", list(d.shape),
                                             blank_metrics(), verdict="SKIP")
            job.record["outputs"].append(row.to_dict())


class NotUnique(Kind):
    """Outputs that are not unique (ties, duplicate writers, decompositions): a failed row judged again by what
    every correct result satisfies (unique.py)."""

    def applies(self, job: Comparison) -> bool:
        return job.validity is not None

    def compare(self, job: Comparison) -> None:
        assert job.validity is not None
        api, args, kwargs = job.validity
        judge_by_validity(job.record, api, job.specs, job.options.standard, job.bench, job.device, args, kwargs)


KINDS = (FloatPairs, Dropout, MindSporeMetrics, NotSaved, NotUnique)


def kinds_for(job: Comparison) -> list[Kind]:
    """The kinds of a comparison's outputs, in the order their rows are made: the saved pairs' values (a dropout's,
    else float pairs; with MindSpore's metrics on a MindSpore dump), the unsaved ones, then a validity judgement."""
    unsaved = [i for i, d in enumerate(job.device) if isinstance(d, Unsaved)]
    saved = None if not unsaved else [i for i in range(len(job.device)) if i not in unsaved]
    values: Kind = Dropout(saved)
    if not values.applies(job):
        values = FloatPairs(saved)
    if MindSporeMetrics(saved, values).applies(job):
        values = MindSporeMetrics(saved, values)
    found = [values] if saved is None or saved else []
    if unsaved:
        found.append(NotSaved(unsaved))
    elif NotUnique(None).applies(job):
        found.append(NotUnique(None))
    return found


def compare_outputs(job: Comparison) -> None:
    """The record's rows of these outputs, each kind comparing its own."""
    for kind in kinds_for(job):
        kind.compare(job)
