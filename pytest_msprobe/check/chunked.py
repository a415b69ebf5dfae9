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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..metrics import storage
from ..metrics import vectorised as M
from ..metrics.streamed import Streamed as StreamedMetrics
from ..records.record import Row
from ..runs import chunks
from ..runs.execution import (
    NotCheckable,
    first_output_dtype,
    first_output_shape,
    seed_random_apis,
    tensors_of,
)
from ..runs.terms import terms_fn
from ..runs.third_run import forward_sums
from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list, thresholds_for
from ..verdict import judge, standards
from ..verdict.strict import streamed as S
from .compare import dress, stored
from .prepare import terms_scale
from .source import RunsStrategy

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


def gib(n: float) -> str:
    """A size in bytes as people read it: 1.50 GiB, 384.0 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}" if unit != "GiB" else f"{n / (1 << shift):.2f} {unit}"
    return f"{int(n)} bytes"


def piece_plan(runs: list[chunks.RunSpec], limit: int) -> tuple[int, int]:
    """(rows, columns) per piece: the most rows whose pieces, all runs' outputs and the checks' copies fit in
    `limit` bytes beside the passes' own plans (StreamedMetrics.plan_bytes); a contraction's columns cut too where
    even ROW_MULTIPLE rows of the whole width do not fit."""
    first = runs[0].chunking
    plans = StreamedMetrics.plan_bytes(first.rows * first.width, chunks.output_itemsize(runs[0]))
    given, limit = limit, limit - plans

    def cost(rows: int, columns: int) -> int:
        outputs = sum(chunks.output_itemsize(s) for s in runs) * rows * first.width
        return 2 * outputs + max(chunks.piece_bytes(s, rows, columns) for s in runs)

    columns = first.width
    if first.columns and cost(chunks.ROW_MULTIPLE, columns) > limit:
        while columns > chunks.ROW_MULTIPLE and cost(chunks.ROW_MULTIPLE, columns) > limit:
            columns = max(chunks.ROW_MULTIPLE, columns // 2 // chunks.ROW_MULTIPLE * chunks.ROW_MULTIPLE)
    rows = chunks.ROW_MULTIPLE
    while rows * 2 <= first.rows and cost(rows * 2, columns) <= limit:
        rows *= 2
    if cost(rows, columns) > limit:
        raise NotCheckable(f"{first.api}: even one piece of {rows} rows x {columns} columns needs "
                           f"{gib(cost(rows, columns))} and the checks' plans {gib(plans)}, over the memory budget "
                           f"of {gib(given)} (--msprobe-max-memory)")
    return rows, columns


def check(item: Any, plan: Plan, device_out: torch.Tensor) -> None:
    """The row of a re-run item's one float output checked in pieces (`plan`), into its record's outputs."""
    record, api, specs, options = item.record, item.name.api_name, item.specs, item.options
    prefix, contract, scalar_operand, narrow = _settings(item)
    d = stored(device_out)[1].reshape(-1)
    device_dtype = str(device_out.dtype)
    shape = [int(x) for x in device_out.shape]
    bench_spec = plan.specs[0]
    bench_np = np.dtype(str(chunks.output_dtype(bench_spec)).split(".")[1])
    work = np.dtype(np.float32 if device_dtype == standards.BF16 else bench_np)
    dev_dtype = np.dtype(np.float32) if storage.is_bits(d) else d.dtype
    row = standards.blank_row(f"{prefix}.0", standards.ERROR, "", str(chunks.output_dtype(bench_spec)), device_dtype, shape)
    th, algo, limits = standards.metric_plan(row, device_dtype, work, api, specs, _metric_standard(options))
    stand_b = np.broadcast_to(np.zeros((), bench_np), d.shape)
    if device_dtype not in standards.threshold_sections(specs)[1]["layer2_dtypes"] or not \
            _fused_ok(stand_b, d, dev_dtype, th, limits, work, device_dtype):
        raise NotCheckable(f"{api}: a {device_dtype} output is not checked in pieces (msprobe's metrics read it "
                           "whole); it does not fit the memory budget")
    kind = error_kind(api, specs)
    has_t = plan.role == "torch" and any(s.name == "t" for s in plan.specs)
    arrays = judge.StrictArrays(stand_b, d, d if has_t else None, d if plan.role == "magnitude" or plan.sums_rules
                                else None, kind, int(shape[-1]) if shape else 1, None,
                                str(narrow) if narrow is not None and narrow.itemsize < device_out.dtype.itemsize
                                else None)
    dress(arrays, api, specs, False, scalar_operand, plan.sums_rules, contract, device_dtype)
    strict_on = options.standard == "strict"
    dtype, rules = judge.strict_rules(arrays, device_dtype, thresholds_for(specs, api))
    floor = 0.0
    if strict_on and arrays.kind in ("reduction", "contraction"):  # the bench's sum of squares, in einsum's order
        squares = S.Squares()
        for _, piece in chunks.pieces_of([bench_spec], plan.rows, plan.columns):
            squares.feed(piece["b"].numpy())
        floor = S.floor(squares.finish(), d.size, bench_np.itemsize, rules, arrays.kind)
    metrics = StreamedMetrics(d, dev_dtype, limits, work)
    strict_pass = S.Streamed(d, dtype, rules, S.Cut(arrays.kind, arrays.row), floor, has_t) if strict_on else None
    pending = _Pending()
    for start, piece in chunks.pieces_of(plan.specs, plan.rows, plan.columns):
        if plan.bias is not None:  # the product before the bias (third_run.bench_product), piece by piece
            piece["prod"] = (piece["b"].view(-1, plan.bias.numel()) - plan.bias).reshape(-1)
        host = {_KEY[name]: _host(name, t) for name, t in piece.items()}
        del piece
        pending.add(start, host)
        _feed(lambda lo, arrays: metrics.feed(lo, arrays["b"]), metrics.done, start, host, pending, ("b",), _JOIN)
        if strict_pass is not None:
            _feed(strict_pass.feed, strict_pass.done, start, host, pending, tuple(host), strict_pass.block)
        pending.drop(min(metrics.done(), strict_pass.done() if strict_pass is not None else metrics.done()))
    stats, bench_worst = metrics.finish()
    zero = th["layer1"]["cosine"]["zero_eps"]  # at or below it on either side the cosine reads no array
    n_max = max(stats.device_max, -stats.device_min)
    if stats.n_nonfinite or (min(n_max, stats.bench_absmax) > zero and not M.dots_unscaled(n_max, stats.bench_absmax)):
        raise NotCheckable(f"{api}: the output holds inf/NaN or values beyond 1e100, which msprobe's metrics read "
                           "whole; it does not fit the memory budget")
    result = strict_pass.finish() if strict_pass is not None else None
    if strict_pass is not None and result is None:
        raise NotCheckable(f"{api}: the strict totals are not finite (inf/NaN elements), which the strict checks "
                           "read whole; the output does not fit the memory budget")
    w = stats.worst
    worst = standards.worst_values(np.array([bench_worst], bench_np), d[w:w + 1], work)
    standards.from_stats(row, stats, stand_b, d, worst, standards.Plan(device_dtype, dev_dtype, work, th, algo, limits,
                                                                       _metric_standard(options)))
    judge.decide(row, options.standard, api_name=api, specs=specs,
                 evidence=judge.Evidence(None, arrays, options.reference_results, result))
    record.outputs.append(Row(**row.to_dict()))


def _settings(item: Any) -> tuple[str, str, bool, torch.dtype | None]:
    """A piece-checked item's row prefix, contract, whether a Python number is among its arguments, and the
    autocast dtype its kernel computes in where that is narrower (compare.strict_arrays' `narrow`)."""
    from .calls import has_scalar_operand

    autocast, api, inputs = item.plan.autocast, item.name.api_name, item.inputs
    narrow = autocast if autocast is not None and in_list(item.specs, api, "error_model",
                                                          "autocast_lower_precision") else None
    return (f"{item.name.full_name}.forward.output", item.where.contract,
            has_scalar_operand(inputs.args, inputs.kwargs), narrow)


def _feed(feed: Callable[[int, dict[str, np.ndarray]], int], done: Callable[[], int], start: int,
          host: dict[str, np.ndarray], pending: _Pending, keys: tuple[str, ...], join: int) -> None:
    """A pass fed the piece at `start`: first the rest of the last piece joined to the next `join` elements (the
    chunk or block they share: a copy of that much only), then the piece itself, as views."""
    lo = done()
    if lo < start:
        feed(lo, pending.window(lo, keys, start + join))
        lo = done()
    if lo >= start:
        feed(lo, {k: host[k][lo - start:] for k in keys})


_KEY = {"b": "b", "t": "t", "mag": "mag", "sum": "mag", "prod": "prod"}  # runs -> the strict pass's arrays
_JOIN = 4 * 2048  # elements of a new piece joined to the last one's rest: more than one chunk of the metric pass


def _host(name: str, t: torch.Tensor) -> np.ndarray:
    """A piece as the passes read it: the bench in its own dtype, a device-dtype run as stored() gives it."""
    return t.numpy() if name in ("b", "prod") or t.dtype in (torch.float32, torch.float64) else stored(t)[1]


def _fused_ok(b: np.ndarray, d: np.ndarray, dev_dtype: np.dtype[Any], th: Any, limits: Any, work: np.dtype[Any],
              device_dtype: str) -> bool:
    from ..metrics import fused

    return fused.supported(b, d, dev_dtype, th["ulp"][device_dtype]["compute_dtype"] if limits.ulp else None, work)


def _metric_standard(options: CheckOptions) -> str:
    return "msprobe26" if options.standard == "msprobe26" else "msprobe"


class _Pending:
    """The pieces not yet taken by both passes, from the earlier one's position on."""

    def __init__(self) -> None:
        self.start = 0
        self.parts: list[tuple[int, dict[str, np.ndarray]]] = []

    def add(self, start: int, arrays: dict[str, np.ndarray]) -> None:
        self.parts.append((start, arrays))

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
        runs.append((inputs.args, inputs.kwargs, _wide if magnitude else _own, magnitude))
    numel = math.prod(out_shape)
    # a backward item holds each side's graph and gradients too: 4x its forward's (a linear's, measured: 3.2x)
    need = memory_need(runs, numel, wide.itemsize) * (4 if item.want_grad else 1)
    limit = budget(options)
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


def _own(t: torch.Tensor) -> torch.dtype:
    return t.dtype


def _wide(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.dtype == torch.float64 or not t.is_floating_point() else torch.float32


class Pieces(RunsStrategy):
    """A runs strategy (source.RunsStrategy): the device's run, whole, on the inputs themselves where it cannot
    write them (`item.shared`; no bench side is made), then the pieces' runs and checks (`check`)."""

    def __init__(self, item: Any, pieces: Plan) -> None:
        from .execute import Runs, Sides
        from .placement import BenchSide, device_side, share

        self.item, self.pieces = item, pieces
        inputs, where, shared = item.inputs, item.where, item.shared
        unmade = BenchSide([], {}, _own, item, False)  # never made: the pieces make their own
        share(item, False)
        if shared is not None:  # the pieces read the inputs after the device's run: it writes into copies of its own
            shared.give = False
        self.runs = Runs(item, Sides(device_side(inputs, where, False, shared), unmade, False), None, None)

    @contextmanager
    def guarded(self) -> Iterator[None]:
        with self.runs.guarded():
            yield

    def run(self) -> torch.Tensor:
        """The device's output: one float tensor, else NotCheckable."""
        item = self.item
        seed_random_apis(item.record.seed, item.where.device)
        leaves = self.runs.device_forward().leaves_d
        if len(leaves) != 1 or not isinstance(leaves[0], torch.Tensor) or not leaves[0].is_floating_point():
            raise NotCheckable(f"{item.name.api_name}: the device returned {len(leaves)} outputs, not one float "
                               "tensor: not checked in pieces, and the whole check does not fit the memory budget")
        return leaves[0]

    def compare(self, outputs: torch.Tensor) -> None:
        record, pieces = self.item.record, self.pieces
        started = time.perf_counter()
        check(self.item, pieces, outputs.detach())
        if pieces.label is not None:
            record.reference = pieces.label
        record.timings["pieces_s"] = time.perf_counter() - started


__all__ = ["Pieces", "Plan", "budget", "check", "gib", "memory_need", "piece_plan", "pieces_for", "plan_runs"]
