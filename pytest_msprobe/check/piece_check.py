"""An output checked a block of rows at a time (kinds.InPieces): each run's pieces (runs/chunks.py) fed, as they
come, to msprobe's metric pass and to the strict pass (metrics/streamed.py, verdict/strict/streamed.py), which
keep only their statistics: the row, its statistics and its verdict are the whole check's, bit for bit. A
contraction's or reduction's strict scale floor needs the bench's sum of squares first, so there the bench runs
twice. Which items are cut, and how (`Plan`), is chunked.py's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..metrics import fused, storage
from ..metrics import vectorised as M
from ..metrics.streamed import Streamed as StreamedMetrics
from ..records.record import Row
from ..runs import chunks
from ..runs.execution import NotCheckable
from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list, thresholds_for
from ..verdict import judge, standards
from ..verdict.strict import streamed as S
from .compare import Comparison, dress, stored


@dataclass
class Plan:
    """How a call is checked in pieces: its runs, rows and columns per piece, the third run's role and label, the
    section of the strict thresholds a magnitude run of a sum scales (None without one)."""

    specs: list[chunks.RunSpec]
    rows: int
    columns: int
    role: str
    label: str | None
    sums_rules: str | None
    bias: torch.Tensor | None = None  # a contraction's bias in the bench's dtype: the product is the bench minus it
    position: int | None = None  # a backward item's: the tensor argument whose gradient this output is


@dataclass
class _Output:
    """The one float output checked in pieces, as every pass reads it: its comparison (`job.pieces` is its Plan),
    the device's values flat as stored, the bench's dtype, its row, the metric plan and the strict arrays."""

    job: Comparison
    plan: Plan
    d: np.ndarray
    bench_np: np.dtype[Any]
    row: standards.OutputComparison
    metric: standards.Plan
    arrays: judge.StrictArrays


def check(job: Comparison) -> None:
    """The row of an item's one float output checked in pieces (kinds.InPieces), into its record's outputs: the
    runs a block of rows at a time, each block fed to msprobe's metric pass and to the strict pass."""
    out = _output(job)
    metrics, strict_pass = _passes(out)
    _feed_pieces(out, metrics, strict_pass)
    _finish(out, metrics, strict_pass)


def _output(job: Comparison) -> _Output:
    """The device's output as the passes read it, its blank row and metric plan, and its strict arrays (the
    bench's stand-in has the output's shape and no values: the passes read the bench piece by piece)."""
    plan, device_out = job.pieces, job.device[0].detach()
    d = stored(device_out)[1].reshape(-1)
    device_dtype, shape = str(device_out.dtype), [int(x) for x in device_out.shape]
    bench_dtype = chunks.output_dtype(plan.specs[0])
    bench_np = np.dtype(str(bench_dtype).split(".")[1])
    work = np.dtype(np.float32 if device_dtype == standards.BF16 else bench_np)
    dev_dtype = np.dtype(np.float32) if storage.is_bits(d) else d.dtype
    row = standards.blank_row(f"{job.prefix}.{plan.position or 0}", standards.ERROR, "", str(bench_dtype),
                              device_dtype, shape)
    standard = _metric_standard(job.options)
    th, algo, limits = standards.metric_plan(row, device_dtype, work, job.api, job.specs, standard)
    stand_b = np.broadcast_to(np.zeros((), bench_np), d.shape)
    compute = th["ulp"][device_dtype]["compute_dtype"] if limits.ulp else None
    if device_dtype not in standards.threshold_sections(job.specs)[1]["layer2_dtypes"] or \
            not fused.supported(stand_b, d, dev_dtype, compute, work):
        raise NotCheckable(f"{job.api}: a {device_dtype} output is not checked in pieces (msprobe's metrics read it "
                           "whole); it does not fit the memory budget")
    narrow = job.autocast if job.autocast is not None and in_list(job.specs, job.api, "error_model",
                                                                  "autocast_lower_precision") else None
    arrays = judge.StrictArrays(stand_b, d, d if _has_torch_run(plan) else None,
                                d if plan.role == "magnitude" or plan.sums_rules else None,
                                error_kind(job.api, job.specs), int(shape[-1]) if shape else 1, None,
                                str(narrow) if narrow is not None and narrow.itemsize < device_out.dtype.itemsize
                                else None)
    dress(arrays, job, plan.sums_rules, device_dtype)
    metric = standards.Plan(device_dtype, dev_dtype, work, th, algo, limits, standard)
    return _Output(job, plan, d, bench_np, row, metric, arrays)


def _has_torch_run(plan: Plan) -> bool:
    return plan.role == "torch" and any(s.name == "t" for s in plan.specs)


def _passes(out: _Output) -> tuple[StreamedMetrics, S.Streamed | None]:
    """msprobe's metric pass and, under strict, the strict pass; a contraction's or reduction's strict scale floor
    from the bench's sum of squares, which a first run of the bench pieces gives."""
    job, plan, arrays, metric = out.job, out.plan, out.arrays, out.metric
    metrics = StreamedMetrics(out.d, metric.dev_dtype, metric.limits, metric.work)
    if job.options.standard != "strict":
        return metrics, None
    dtype, rules = judge.strict_rules(arrays, metric.dtype, thresholds_for(job.specs, job.api))
    floor = 0.0
    if arrays.kind in ("reduction", "contraction"):  # the bench's sum of squares, in einsum's order
        squares = S.Squares()
        for _, piece in chunks.pieces_of([plan.specs[0]], plan.rows, plan.columns):
            squares.feed(piece["b"].numpy())
        floor = S.floor(squares.finish(), out.d.size, out.bench_np.itemsize, rules, arrays.kind)
    return metrics, S.Streamed(out.d, dtype, rules, S.Cut(arrays.kind, arrays.row), floor, _has_torch_run(plan))


def _feed_pieces(out: _Output, metrics: StreamedMetrics, strict_pass: S.Streamed | None) -> None:
    """Each piece of the runs, on the host, fed to both passes; what both have taken is dropped."""
    plan, pending = out.plan, _Pending()
    for start, piece in chunks.pieces_of(plan.specs, plan.rows, plan.columns):
        if plan.bias is not None:  # the product before the bias (third_run.bench_product), piece by piece
            piece["prod"] = (piece["b"].view(-1, plan.bias.numel()) - plan.bias).reshape(-1)
        host = {_KEY[name]: _host(name, t) for name, t in piece.items()}
        del piece
        pending.add(start, host)
        pending.feed(lambda lo, arrays: metrics.feed(lo, arrays["b"]), metrics.done, start, ("b",), _JOIN)
        if strict_pass is not None:
            pending.feed(strict_pass.feed, strict_pass.done, start, tuple(host), strict_pass.block)
        pending.drop(min(metrics.done(), strict_pass.done() if strict_pass is not None else metrics.done()))


def _finish(out: _Output, metrics: StreamedMetrics, strict_pass: S.Streamed | None) -> None:
    """The row from both passes' statistics, judged by the standard, into the record; NotCheckable where an
    output's values need the whole arrays (non-finite, beyond 1e100)."""
    job, d, metric = out.job, out.d, out.metric
    stats, bench_worst = metrics.finish()
    zero = metric.th["layer1"]["cosine"]["zero_eps"]  # at or below it on either side the cosine reads no array
    n_max = max(stats.device_max, -stats.device_min)
    if stats.n_nonfinite or (min(n_max, stats.bench_absmax) > zero and not M.dots_unscaled(n_max, stats.bench_absmax)):
        raise NotCheckable(f"{job.api}: the output holds inf/NaN or values beyond 1e100, which msprobe's metrics "
                           "read whole; it does not fit the memory budget")
    result = strict_pass.finish() if strict_pass is not None else None
    if strict_pass is not None and result is None:
        raise NotCheckable(f"{job.api}: the strict totals are not finite (inf/NaN elements), which the strict "
                           "checks read whole; the output does not fit the memory budget")
    w = stats.worst
    worst = standards.worst_values(np.array([bench_worst], out.bench_np), d[w:w + 1], metric.work)
    standards.from_stats(out.row, stats, out.arrays.bench, d, worst, metric)
    judge.decide(out.row, job.options.standard, api_name=job.api, specs=job.specs,
                 evidence=judge.Evidence(None, out.arrays, job.options.reference_results, result))
    job.record.outputs.append(Row(**out.row.to_dict()))


_KEY = {"b": "b", "t": "t", "mag": "mag", "sum": "mag", "prod": "prod"}  # runs -> the strict pass's arrays
_JOIN = 4 * 2048  # elements of a new piece joined to the last one's rest: more than one chunk of the metric pass


def _host(name: str, t: torch.Tensor) -> np.ndarray:
    """A piece as the passes read it: the bench in its own dtype, a device-dtype run as stored() gives it."""
    return t.numpy() if name in ("b", "prod") or t.dtype in (torch.float32, torch.float64) else stored(t)[1]


def _metric_standard(options: CheckOptions) -> str:
    return "msprobe26" if options.standard == "msprobe26" else "msprobe"


class _Pending:
    """The pieces not yet taken by both passes, from the earlier one's position on."""

    def __init__(self) -> None:
        self.start = 0
        self.parts: list[tuple[int, dict[str, np.ndarray]]] = []

    def add(self, start: int, arrays: dict[str, np.ndarray]) -> None:
        self.parts.append((start, arrays))

    def feed(self, feed: Callable[[int, dict[str, np.ndarray]], int], done: Callable[[], int], start: int,
             keys: tuple[str, ...], join: int) -> None:
        """A pass fed the piece added at `start`: first the rest of the pieces before it joined to the next `join`
        elements (the chunk or block they share: a copy of that much only), then the piece itself, as views."""
        lo = done()
        if lo < start:
            feed(lo, self.window(lo, keys, start + join))
            lo = done()
        if lo >= start:
            piece = self.parts[-1][1]
            feed(lo, {k: piece[k][lo - start:] for k in keys})

    def window(self, lo: int, keys: tuple[str, ...], hi: int | None = None) -> dict[str, np.ndarray]:
        """The arrays `keys` from element `lo` to `hi` (or the end of the last piece): one piece's view, else the
        pieces joined."""
        out = {}
        for key in keys:
            pieces = [a[key][max(0, lo - s):None if hi is None else max(0, hi - s)] for s, a in self.parts
                      if s + a[key].size > lo and (hi is None or s < hi)]
            out[key] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return out

    def drop(self, upto: int) -> None:
        """Forget the elements before `upto`."""
        self.parts = [(s, a) for s, a in self.parts if s + next(iter(a.values())).size > upto]
