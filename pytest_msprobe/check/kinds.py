"""Each kind of output compares itself, as torch.testing's comparison makes each kind of input a `Pair`: float pairs
(msprobe's metrics and the selected standard), a dropout's output (the fraction of zeros), MindSpore's outputs (float
pairs with its checker's metrics), outputs the dump did not save (SKIP rows), outputs that are not unique (judged
again by validity), a solve's (judged again by its backward error), an ill-conditioned function's (judged again
by its mixed forward-backward error), an overflow_check dump's (classified), and an
output whose whole check does not fit in memory (checked a block of rows at a time). `kinds_for` picks the kinds
once from the specs and the outputs; `compare_outputs` knows none of them. KINDS lists them; a new kind of output
is one class. What a comparison reads: compare.Comparison.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from ..metrics.vectorised import blank_metrics
from ..records.record import DropoutRow, OverflowRow, Record, Row
from ..runs import capture
from ..runs.execution import NotCheckable
from ..verdict import ms_results, standards
from . import compare, conditioning, piece_check, residuals
from .compare import Comparison
from .recorded import Unsaved
from .unique import judge_by_validity


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
        if self.indices is None:
            return compare.compare_floats(job)
        summed = job.summed
        compare.compare_floats(dataclasses.replace(
            job, bench=self.pick(job.bench) or [], device=self.pick(job.device) or [], third=self.pick(job.third),
            positions=self.pick(job.positions), estimated=self.pick(job.estimated),
            summed=None if summed is None else (self.pick(summed[0]) or [], summed[1])))


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
        job.record.outputs.append(DropoutRow(f"{job.prefix}.0", status, message, str(b.dtype), str(d.dtype),
                                             list(d.shape), {}))
        job.record.notes.append("dropout: judged by the fraction of zeros (msprobe's rule), not by values")


class MindSporeMetrics(Kind):
    """Another kind's rows of a MindSpore dump, each with the MindSpore checker's metrics (its CSV columns)."""

    def __init__(self, indices: list[int] | None, inner: Kind) -> None:
        super().__init__(indices)
        self.inner = inner

    def applies(self, job: Comparison) -> bool:
        return job.ms_format

    def compare(self, job: Comparison) -> None:
        start = len(job.record.outputs)
        self.inner.compare(job)
        rows, bench, device = job.record.outputs[start:], self.pick(job.bench) or [], self.pick(job.device) or []
        if len(rows) != len(device):
            return
        epsilon = job.specs["thresholds"]["mindspore"]["epsilon"]
        for row, b_value, d_value in zip(rows, bench, device):
            b, d = compare.to_numpy(b_value), compare.to_numpy(d_value)
            if b[0] == "tensor" and d[0] == "tensor":
                row.ms_metrics = ms_results.ms_metrics(b[1], d[1], epsilon)


class NotSaved(Kind):
    """Recorded outputs the dump has no file for: a SKIP row each, never compared."""

    def compare(self, job: Comparison) -> None:
        _skip_rows(job, self.indices or [], lambda d: f"{d.where}: not saved in dump_tensor_data/, nothing to compare")


class Undefined(Kind):
    """Outputs the API leaves undefined for this call (api_specs undefined_outputs: native_batch_norm's saved
    statistics in eval mode): a SKIP row each, never compared."""

    def compare(self, job: Comparison) -> None:
        assert job.validity is not None
        why = job.specs["undefined_outputs"][job.validity[0]]["why"]
        _skip_rows(job, self.indices or [], lambda d: f"undefined: {why}")


def _skip_rows(job: Comparison, indices: list[int], message: Callable[[Any], str]) -> None:
    """A SKIP row for each output at `indices`, named by its position, with its shape and `message(output)`."""
    for i in indices:
        d = job.device[i]
        position = job.positions[i] if job.positions is not None else i
        shape = list(d.shape) if isinstance(d, (torch.Tensor, Unsaved)) else None
        row = standards.OutputComparison(f"{job.prefix}.{position}", "SKIP", message(d), " ", " ", shape,
                                         blank_metrics(), verdict="SKIP")
        job.record.outputs.append(Row(**row.to_dict()))


def undefined_outputs(job: Comparison) -> list[int]:
    """The outputs this call leaves undefined (api_specs undefined_outputs), by the argument that says so."""
    if job.validity is None or job.gradients:
        return []
    api, args, kwargs = job.validity
    rule = job.specs.get("undefined_outputs", {}).get(api)
    if not rule:
        return []
    given = kwargs.get(rule["argument"], args[rule["position"]] if len(args) > rule["position"] else None)
    return [i for i in rule["outputs"] if i < len(job.device)] if given is rule["value"] else []


class NotUnique(Kind):
    """Outputs that are not unique (ties, duplicate writers, decompositions): a failed row judged again by what
    every correct result satisfies (unique.py)."""

    def applies(self, job: Comparison) -> bool:
        return job.validity is not None

    def compare(self, job: Comparison) -> None:
        assert job.validity is not None
        judge_by_validity(job.record, job.validity, job.specs, job.options.standard, job.bench, job.device)


class BackwardError(Kind):
    """A solve's or factorisation's output 0 (inv, solve, cholesky, lstsq): a failed row judged again by its
    backward error (residuals.py), which a correct solver keeps small however ill-conditioned the input."""

    def applies(self, job: Comparison) -> bool:
        return job.validity is not None and residuals.applies(job.validity[0], job.specs)

    def compare(self, job: Comparison) -> None:
        assert job.validity is not None
        residuals.judge_by_backward_error(job.record, job.validity, job.specs, job.options.standard, job.device)


class IllConditioned(Kind):
    """An ill-conditioned elementwise function's output (lgamma, digamma, polygamma): a failed row judged again by
    its mixed forward-backward error where a ULP of the argument moves it by more than its forward bound, by the
    usual check elsewhere (conditioning.py)."""

    def applies(self, job: Comparison) -> bool:
        return job.validity is not None and conditioning.applies(job.validity[0], job.specs)

    def compare(self, job: Comparison) -> None:
        conditioning.judge(job)


class Overflow(Kind):
    """An overflow_check dump's outputs: each classified as a normal, abnormal or unreproduced overflow
    (overflow.py); no precision verdict."""

    def applies(self, job: Comparison) -> bool:
        return job.overflow

    def compare(self, job: Comparison) -> None:
        capture.stash(compared_bench=job.bench, compared_device=job.device, positions=job.positions)
        _classify(job.record, job.prefix, job.bench, job.device, job.positions)


class InPieces(Kind):
    """One float output whose whole check does not fit in memory: the bench's runs and the checks a block of rows
    at a time (piece_check.check), their row bit for bit the whole check's."""

    def applies(self, job: Comparison) -> bool:
        return job.pieces is not None

    def compare(self, job: Comparison) -> None:
        piece_check.check(job)


KINDS = (FloatPairs, Dropout, MindSporeMetrics, NotSaved, Undefined, NotUnique, BackwardError, IllConditioned,
         Overflow, InPieces)


def kinds_for(job: Comparison) -> list[Kind]:
    """The kinds of a comparison's outputs, in the order their rows are made: the compared pairs' values (a
    dropout's, else float pairs; with MindSpore's metrics on a MindSpore dump), the unsaved and the undefined
    ones, then a judgement again of failed rows (which reads every output: none where some are set apart)."""
    for whole in (Overflow(None), InPieces(None)):
        if whole.applies(job):
            return [whole]
    unsaved = [i for i, d in enumerate(job.device) if isinstance(d, Unsaved)]
    undefined = [i for i in undefined_outputs(job) if i not in unsaved]
    apart = unsaved + undefined
    saved = None if not apart else [i for i in range(len(job.device)) if i not in apart]
    values: Kind = Dropout(saved)
    if not values.applies(job):
        values = FloatPairs(saved)
    if MindSporeMetrics(saved, values).applies(job):
        values = MindSporeMetrics(saved, values)
    found = [values] if saved is None or saved else []
    found += [kind for kind in (NotSaved(unsaved), Undefined(undefined)) if kind.indices]
    again = (BackwardError(None), IllConditioned(None), NotUnique(None))
    return found if apart else found + next(([kind] for kind in again if kind.applies(job)), [])


def compare_outputs(job: Comparison) -> None:
    """The record's rows of these outputs, each kind comparing its own."""
    for kind in kinds_for(job):
        kind.compare(job)


# ----------------------------------------------------------------------------- overflow (REFERENCE §3.6)


def overflow_count(value: Any) -> tuple[bool, int, int]:
    """(overflows, #inf, #NaN) of one output leaf, msprobe's CPU rule."""
    if isinstance(value, float):
        return (not math.isfinite(value)), int(math.isinf(value)), int(math.isnan(value))
    if not _checkable(value):
        return False, 0, 0
    t = value.detach()
    n_inf, n_nan = int(torch.isinf(t).sum()), int(torch.isnan(t).sum())
    return bool(n_inf or n_nan), n_inf, n_nan


def _device_only(bench: Any, device: Any) -> int:
    """Positions where the device is inf/NaN and the bench is finite (0 when they cannot be paired)."""
    if not (isinstance(bench, torch.Tensor) and isinstance(device, torch.Tensor)) or bench.shape != device.shape:
        return 0
    return int((~torch.isfinite(device.detach().cpu()) & torch.isfinite(bench.detach().cpu())).sum())


def _checkable(value: Any) -> bool:
    return isinstance(value, float) or (isinstance(value, torch.Tensor) and value.numel() > 0
                                         and (value.is_floating_point() or value.is_complex()))


def _classify(record: Record, prefix: str, bench: list[Any], device: list[Any],
              positions: list[int] | None) -> None:
    """Each floating-point output's overflow classified into its row; the item's status and overflow verdict."""
    verdicts = []
    for i, (b, d) in enumerate(zip(bench, device)):
        if not (_checkable(b) or _checkable(d)):
            continue
        k = positions[i] if positions is not None and i < len(positions) else i
        name = f"{prefix}.{k}"
        over_d, inf_d, nan_d = overflow_count(d)
        over_b, inf_b, nan_b = overflow_count(b)
        numel = d.numel() if isinstance(d, torch.Tensor) else 1
        counts = f"device {inf_d} inf, {nan_d} NaN; bench {inf_b} inf, {nan_b} NaN of {numel}"
        device_only = _device_only(b, d)
        if over_d and over_b and device_only:
            verdict, status, message = "abnormal", "error", (
                f"abnormal overflow: the device overflows at {device_only} position(s) where the bench is finite "
                f"({counts})")
        elif over_d and over_b:
            verdict, status, message = "normal", "pass", f"normal overflow: the bench overflows too ({counts})"
        elif over_d:
            verdict, status, message = "abnormal", "error", \
                f"abnormal overflow: only the device overflows, the bench in the same dtype does not ({counts})"
        elif over_b:
            verdict, status, message = "abnormal", "error", \
                f"abnormal: the bench overflows but the device does not (saturation? {counts})"
        else:
            verdict, status, message = "not reproduced", "pass", \
                "no overflow reproduced on the device or the bench with these inputs"
        dtype: Callable[[Any], str] = (  # noqa: E731
            lambda v: str(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__)
        record.outputs.append(OverflowRow(
            name, status, message, dtype(b), dtype(d), list(d.shape) if isinstance(d, torch.Tensor) else None,
            blank_metrics(), verdict=status, verdict_message=message,
            overflow={"verdict": verdict, "device": over_d, "bench": over_b, "device_inf": inf_d,
                      "device_nan": nan_d, "bench_inf": inf_b, "bench_nan": nan_b}))
        verdicts.append(verdict)
    if not record.outputs:
        raise NotCheckable(f"{prefix}: no floating-point output to check for overflow")
    bad = [o for o in record.outputs if o.status == "error"]
    record.status = "error" if bad else "pass"
    record.layer1_status = record.status
    overall = "abnormal" if bad else ("normal" if "normal" in verdicts else "not reproduced")
    record.overflow = overall
    record.message = "; ".join(f"{o.name.rsplit('.', 2)[-2]}.{o.name.rsplit('.', 1)[-1]}: {o.message}"
                                  for o in (bad or record.outputs[:1]))


__all__ = ["KINDS", "Comparison", "Dropout", "FloatPairs", "IllConditioned", "InPieces", "Kind", "MindSporeMetrics",
           "NotSaved", "NotUnique", "Overflow", "Undefined", "compare_outputs", "kinds_for", "overflow_count"]
