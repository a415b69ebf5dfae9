"""A forward item whose check would not fit in memory, checked a block of output rows at a time.

The whole check holds, beside the device output, the bench's cast inputs and output, the third run's and the
magnitude run's: for an lm_head in bf16 ([2048, 4096] x [128256, 4096]) some 6 GiB beside 1.5 GiB of the call's own
tensors. `memory_need` estimates that; where it exceeds the item's budget (--msprobe-max-memory, else what the host
has free, less a margin, shared by the workers) and the API's rows are independent (runs/chunks.py), `check` runs
the bench, the third run and the magnitude run a block of rows at a time and feeds each block to msprobe's metric
pass and the strict pass (metrics/streamed.py, verdict/strict/streamed.py), which keep only their statistics: the
row, its statistics and its verdict are the whole check's, bit for bit (tests/test_chunked.py). A contraction's or
reduction's strict scale floor needs the bench's sum of squares first, so there the bench runs twice.

What cannot be checked in pieces and does not fit is skipped with the reason, before anything large is made.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..metrics import fused, storage
from ..metrics import vectorised as M
from ..metrics.streamed import Streamed as StreamedMetrics
from ..records.record import Row
from ..runs import chunks, memory, tiles
from ..runs.execution import (
    NotCheckable,
    first_output_dtype,
    first_output_shape,
    tensors_of,
)
from ..runs.memory import gib
from ..runs.terms import terms_fn
from ..runs.third_run import forward_sums
from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list, thresholds_for
from ..verdict import judge, standards
from ..verdict.strict import streamed as S
from .compare import Comparison, dress, stored
from .prepare import terms_scale

MARGIN = 0.15  # of the host's free memory, left to everything else
MIN_MARGIN = 1 << 30  # bytes left at least


def budget(options: CheckOptions) -> int:
    """Bytes an item's runs beside the device output may hold: --msprobe-max-memory, else the host's available
    memory (MemAvailable) less a margin, divided among the xdist workers that share it."""
    if options.max_memory is not None:
        return options.max_memory
    free = _available()
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    return max(0, int(free - max(MIN_MARGIN, MARGIN * free))) // workers


def _available() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62  # no /proc (not Linux): no limit known


def memory_need(runs: list[tuple[Any, Any, Callable[[torch.Tensor], torch.dtype], bool]], out_numel: int,
                out_itemsize: int) -> int:
    """Bytes the whole check holds beside the device side: per run (args, kwargs, its dtype per tensor, whether it
    takes absolute values first), its cast copy of every tensor input and its output, plus the host's arrays of the
    checks (about two of the device output's size)."""
    total = 2 * out_numel * out_itemsize
    for args, kwargs, dtype_for, absolute in runs:
        tensors = tensors_of([args, kwargs])
        floats = [dtype_for(t) for t in tensors if t.is_floating_point()]
        total += sum(t.numel() * ((dtype_for(t) if t.is_floating_point() else t.dtype).itemsize +
                                  (t.dtype.itemsize if absolute else 0)) for t in tensors)
        total += out_numel * max([out_itemsize, *(f.itemsize for f in floats)])
    return total


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


def piece_plan(runs: list[chunks.RunSpec], limit: int) -> tuple[int, int]:
    """(rows, columns) per piece: the most rows whose pieces, all runs' outputs and the checks' copies fit in
    `limit` bytes beside the passes' own plans (StreamedMetrics.plan_bytes); a contraction's columns cut too where
    even the fewest rows of a block (its chunking's `multiple`) of the whole width do not fit, in whole tiles of the
    bench's (tiles.py)."""
    first = runs[0].chunking
    plans = StreamedMetrics.plan_bytes(first.rows * first.width, chunks.output_itemsize(runs[0]))
    given, limit = limit, limit - plans

    def cost(rows: int, columns: int) -> int:
        rows = min(rows, first.rows)
        outputs = sum(chunks.output_itemsize(s) for s in runs) * rows * first.width
        return 2 * outputs + max(chunks.piece_bytes(s, rows, columns) for s in runs)

    columns = first.width
    if first.columns and cost(first.multiple, columns) > limit:
        while columns > tiles.COLUMNS and cost(first.multiple, columns) > limit:
            columns = max(tiles.COLUMNS, columns // 2 // tiles.COLUMNS * tiles.COLUMNS)
    rows = first.multiple
    while rows * 2 <= first.rows and cost(rows * 2, columns) <= limit:
        rows *= 2
    if cost(rows, columns) > limit:
        raise NotCheckable(f"{first.api}: even one piece of {rows} rows x {columns} columns needs "
                           f"{gib(cost(rows, columns))} and the checks' plans {gib(plans)}, over the memory budget "
                           f"of {gib(given)} (--msprobe-max-memory)")
    return rows, columns


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
    row = standards.blank_row(f"{job.prefix}.0", standards.ERROR, "", str(bench_dtype), device_dtype, shape)
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


def plan_runs(item: Any, bench_args: list[Any], bench_kwargs: dict[str, Any],
              bench_dtype: Callable[[torch.Tensor], torch.dtype], out_shape: tuple[int, ...] | None) -> Plan | None:
    """The runs of a re-run item's forward call checked in pieces (bench "b", third run "t" or magnitude "mag", a
    sum's magnitude run "sum"), or None where its rows are not independent or a run cannot be cut (an NPU op, a
    reference device, random numbers, msprobe's standards' torch run)."""
    options, name, specs, plan, resolved = item.options, item.name, item.specs, item.plan, item.where.resolved
    args, kwargs, bench_device, contract = item.inputs.args, item.inputs.kwargs, item.where.bench, item.where.contract
    api = name.api_name
    if name.api_type == "NPU" or options.reference_device or api in specs.get("dropout_apis", []) or \
            in_list(specs, api, "random_apis"):
        return None
    bench_chunking = chunks.plan(api, bench_args, bench_kwargs, out_shape)
    own = chunks.plan(api, args, kwargs, out_shape)
    if bench_chunking is None or own is None:
        return None
    runs = [chunks.RunSpec("b", resolved.bench_fn, bench_chunking, bench_dtype, device=bench_device)]
    scalars = frozenset(specs["error_model"].get("contraction_scalars", ()))

    def wide(t: torch.Tensor) -> torch.dtype:
        return t.dtype if t.dtype == torch.float64 or not t.is_floating_point() else torch.float32

    role, label, sums = "torch", None, None
    if options.standard == "strict":
        if error_kind(api, specs) == "contraction":
            runs.append(chunks.RunSpec("mag", resolved.bench_fn, own, wide, True, scalars, device=bench_device))
            role, label = "magnitude", "magnitude: the API on |inputs| in fp32" + (
                "" if bench_device == "cpu" else f" on {bench_device}")
        else:
            runs.append(chunks.RunSpec("t", resolved.bench_fn, own, lambda t: t.dtype, autocast=plan.autocast,
                                       device=bench_device))
            label = f"torch's kernel on {bench_device}, device dtype"
            sums = forward_sums(api, specs, kwargs)
            scale = None if sums is not None else terms_scale(options, contract, api, specs, args, False)
            if sums is not None:
                runs.append(chunks.RunSpec("sum", resolved.bench_fn, own, wide, True, scalars, device=bench_device))
            elif scale is not None:  # a composite the contract bounds by its terms (runs/terms.py), elementwise
                sums = "contract_terms"
                runs.append(chunks.RunSpec("sum", terms_fn(api, scale, str(kwargs.get("approximate", "none"))), own,
                                           wide, device=bench_device))
    bias = None
    rule = specs["error_model"].get("contraction_bias", {}).get(api)
    if role == "magnitude" and rule:
        given = bench_kwargs.get(rule["name"], bench_args[rule["position"]] if len(bench_args) > rule["position"]
                                 else None)
        if isinstance(given, torch.Tensor):
            if rule["broadcast"] == "channel" or rule.get("scale") or given.dim() != 1:
                return None  # a product other than bench - bias along the last dimension: not cut
            bias = given.detach().to(bench_dtype(given))
    return Plan(runs, 0, 0, role, label, sums, bias)


def pieces_for(item: Any) -> Plan | None:
    """The memory stage of a re-run item's runs: None where its whole check fits its budget; else how it is checked
    a block of rows at a time (the record says so), or NotCheckable with the reason."""
    from . import precision

    name, options, specs, record = item.name, item.options, item.specs, item.record
    plan, inputs = item.plan, item.inputs
    api = name.api_name
    out_shape = first_output_shape(item.forward.get("output"))
    out_dtype = first_output_dtype(item.forward.get("output"))
    if out_shape is None or out_dtype is None:
        return None
    bench_dtype = precision.bench_dtype(plan)
    wide = bench_dtype(torch.empty(0, dtype=out_dtype))
    runs = [(inputs.args, inputs.kwargs, bench_dtype, False)]  # the bench's arguments: the inputs' sizes
    if options.standard == "strict":  # the third run: the magnitude run's |inputs| for a contraction, else torch's
        magnitude = error_kind(api, specs) == "contraction"
        runs.append((inputs.args, inputs.kwargs, _wide if magnitude else own_dtype, magnitude))
    numel = math.prod(out_shape)
    # a backward item holds each side's graph and gradients too: 4x its forward's (a linear's, measured: 3.2x)
    need = memory_need(runs, numel, wide.itemsize) * (4 if item.want_grad else 1)
    limit = budget(options)
    memory.estimated(need, limit)  # a worker killed while this item runs is named with it (session/inflight.py)
    if need <= limit:
        return None
    why = f"{api}: its check needs about {gib(need)} beside the device side, over the memory budget of " \
          f"{gib(limit)} (--msprobe-max-memory)"
    if item.want_grad:
        raise NotCheckable(f"{why}; a backward item is not checked in pieces")
    notes: list[str] = []
    bench_args, bench_kwargs = precision.bench_arguments(api, inputs, plan, options, specs, notes)
    pieces = plan_runs(item, bench_args, bench_kwargs, bench_dtype, out_shape)
    if pieces is None:
        raise NotCheckable(f"{why}, and its output's rows are not independent: not checked in pieces")
    pieces.rows, pieces.columns = piece_plan(pieces.specs, limit)
    record.notes += notes
    record.pieces = {"rows": pieces.rows, "columns": pieces.columns,
                        "blocks": len(chunks.blocks(pieces.specs[0].chunking.rows, pieces.rows)),
                        "budget": limit, "need": need}
    record.notes.append(f"checked in pieces of {pieces.rows} rows: the whole check needs about {gib(need)}, "
                           f"over the memory budget of {gib(limit)}")
    return pieces


def own_dtype(t: torch.Tensor) -> torch.dtype:
    """A tensor's own dtype, as a run in the device's dtypes computes it."""
    return t.dtype


def _wide(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.dtype == torch.float64 or not t.is_floating_point() else torch.float32


__all__ = ["Plan", "budget", "check", "own_dtype", "memory_need", "piece_plan", "pieces_for", "plan_runs"]
