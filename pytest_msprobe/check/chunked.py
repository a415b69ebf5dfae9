"""Which items are checked a block of output rows at a time, and how: the memory stage of a re-run item.

The whole check holds, beside the device output, the bench's cast inputs and output, the third run's and the
magnitude run's: for an lm_head in bf16 ([2048, 4096] x [128256, 4096]) some 6 GiB beside 1.5 GiB of the call's own
tensors. `memory_need` estimates that; where it exceeds the item's budget (--msprobe-max-memory, else by default
about HEADROOM times the dump's largest call, within what the host has free) and the API's rows are independent
(runs/chunks.py), each output gets a `Plan`: its runs (the bench, the third run, the magnitude run) and the rows and
columns of a piece. piece_check.py checks it so, its row and verdict the whole check's, bit for bit
(tests/test_chunked.py). A backward item is its gradients (`plan_gradients`): a contraction's, each a product of
two matrices checked so, and a pointwise op's, softmax's or norm's, each the backward of a block of rows.

What cannot be checked in pieces and does not fit is skipped with the reason, before anything large is made.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable

import torch

from ..dump.index import tensor_bytes
from ..metrics.streamed import Streamed as StreamedMetrics
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
from ..specs.loader import error_kind, in_list
from .piece_check import Plan
from .prepare import terms_scale

MARGIN = 0.15  # of the host's free memory, left to everything else
MIN_MARGIN = 1 << 30  # bytes left at least
HEADROOM = 1.4  # by default a process holds at most about this many times its dump's largest call's own tensors
FLOOR = 1 << 30  # bytes beside the device side a check may take whole by default, whatever the largest call


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


def piece_plan(runs: list[chunks.RunSpec], limit: int, whose: str = "--msprobe-max-memory") -> tuple[int, int]:
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
                           f"of {gib(given)} ({whose})")
    return rows, columns


def _cuttable(item: Any) -> bool:
    """Whether an item's bench-side runs may be cut at all: not an NPU op's, a reference device's, random numbers'."""
    name, options, specs = item.name, item.options, item.specs
    return not (name.api_type == "NPU" or options.reference_device or name.api_name in specs.get("dropout_apis", [])
                or in_list(specs, name.api_name, "random_apis"))


def plan_runs(item: Any, bench_args: list[Any], bench_kwargs: dict[str, Any],
              bench_dtype: Callable[[torch.Tensor], torch.dtype], out_shape: tuple[int, ...] | None) -> Plan | None:
    """The runs of a re-run item's forward call checked in pieces (bench "b", third run "t" or magnitude "mag", a
    sum's magnitude run "sum"), or None where its rows are not independent or a run cannot be cut (an NPU op, a
    reference device, random numbers, msprobe's standards' torch run)."""
    options, name, specs, plan, resolved = item.options, item.name, item.specs, item.plan, item.where.resolved
    args, kwargs, bench_device, contract = item.inputs.args, item.inputs.kwargs, item.where.bench, item.where.contract
    api = name.api_name
    if not _cuttable(item):
        return None
    bench_chunking = chunks.plan(api, bench_args, bench_kwargs, out_shape)
    own = chunks.plan(api, args, kwargs, out_shape)
    if bench_chunking is None or own is None:
        return None
    runs = [chunks.RunSpec("b", resolved.bench_fn, bench_chunking, bench_dtype, device=bench_device)]
    scalars = frozenset(specs["error_model"].get("contraction_scalars", ()))

    role, label, sums = "torch", None, None
    if options.standard == "strict":
        if error_kind(api, specs) == "contraction":
            runs.append(chunks.RunSpec("mag", resolved.bench_fn, own, _wide, True, scalars, device=bench_device))
            role, label = "magnitude", _magnitude_label(bench_device)
        else:
            runs.append(chunks.RunSpec("t", resolved.bench_fn, own, lambda t: t.dtype, autocast=plan.autocast,
                                       device=bench_device))
            label = f"torch's kernel on {bench_device}, device dtype"
            sums = forward_sums(api, specs, kwargs)
            scale = None if sums is not None else terms_scale(options, contract, api, specs, args, False)
            if sums is not None:
                runs.append(chunks.RunSpec("sum", resolved.bench_fn, own, _wide, True, scalars, device=bench_device))
            elif scale is not None:  # a composite the contract bounds by its terms (runs/terms.py), elementwise
                sums = "contract_terms"
                runs.append(chunks.RunSpec("sum", terms_fn(api, scale, str(kwargs.get("approximate", "none"))), own,
                                           _wide, device=bench_device))
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


def plan_gradients(item: Any, bench_dtype: Callable[[torch.Tensor], torch.dtype],
                   notes: list[str]) -> list[Plan] | None:
    """The runs of a backward item's gradients checked in pieces, one Plan per gradient in the order the device's
    side lists them, or None where they cannot be: a contraction's input and weight gradients (`_products`), or
    the row-local gradients of a pointwise op, softmax or norm (`_row_local`). The recorded gradient must be the
    output's own dtype and shape."""
    api, inputs = item.name.api_name, item.inputs
    out_shape = first_output_shape(item.forward.get("output"))
    cotangent = inputs.cotangents[0] if len(inputs.cotangents) == 1 else None
    if not _cuttable(item) or out_shape is None or not isinstance(cotangent, torch.Tensor) or \
            cotangent.numel() != math.prod(out_shape):
        return None
    grad = cotangent.reshape(out_shape)
    wanted = [(position, t) for position, t in enumerate(tensors_of([inputs.args, inputs.kwargs]))
              if id(t) in inputs.requires_grad and t.is_floating_point()]
    if not wanted:
        return None
    if api in tiles.CONTRACTIONS:
        return _products(item, bench_dtype, grad, wanted)
    # not a name ending in "_": an in-place op's (add_, __iadd__), and with it every operator's (__mul__)
    if api in chunks.ROWWISE or (api in chunks.POINTWISE and not api.endswith("_")):
        return _row_local(item, bench_dtype, grad, wanted, out_shape, notes)
    return None


def _products(item: Any, bench_dtype: Callable[[torch.Tensor], torch.dtype], grad: torch.Tensor,
              wanted: list[tuple[int, torch.Tensor]]) -> list[Plan] | None:
    """A contraction's input and weight gradients, each the product of two matrices (tiles.gradient_operands)
    that the bench computes in tiles whole or not, cut as a matmul's output is; None for a bias's (a sum)."""
    api, inputs, bench = item.name.api_name, item.inputs, item.where.bench
    operands = tiles.operands(api, inputs.args, inputs.kwargs)
    if operands is None or grad.dtype != operands[0].dtype:
        return None
    x, w = operands[0], operands[1]
    which, strict = {id(x): 0, id(w): 1}, item.options.standard == "strict"
    plans = []
    for position, t in wanted:
        if id(t) not in which:
            return None
        a, b = tiles.gradient_operands(api, which[id(t)], grad, x, w)
        chunking = chunks.plan("matmul", [a, b], {}, (a.shape[0], b.shape[1]))
        if chunking is None:
            return None
        runs = [chunks.RunSpec("b", tiles.matmul, chunking, bench_dtype, device=bench)]
        if strict:
            runs.append(chunks.RunSpec("mag", tiles.matmul, chunking, _wide, True, device=bench))
        plans.append(Plan(runs, 0, 0, "magnitude" if strict else "torch", _magnitude_label(bench) if strict else None,
                          None, position=position))
    return plans


def _row_local(item: Any, bench_dtype: Callable[[torch.Tensor], torch.dtype], grad: torch.Tensor,
               wanted: list[tuple[int, torch.Tensor]], out_shape: tuple[int, ...],
               notes: list[str]) -> list[Plan] | None:
    """The gradients of the tensors a pointwise op, softmax or norm cuts with its rows: each row's gradient is the
    backward of that row alone, so each run (the bench, and under strict torch's run in the device dtype) is the
    call's backward on a block of rows. None where a gradient is a sum over rows (a broadcast operand's, a norm's
    weight's) or the runs are ones the pieces do not make (a sum's magnitude run, a sampled torch run)."""
    from . import precision

    api, inputs, options, specs, bench = item.name.api_name, item.inputs, item.options, item.specs, item.where.bench
    if in_list(specs, api, "error_model", "sampled_torch_run") or error_kind(api, specs) == "contraction":
        return None
    bench_args, bench_kwargs = precision.bench_arguments(api, inputs, item.plan, options, specs, notes)
    bench_chunking = chunks.plan(api, bench_args, bench_kwargs, out_shape)
    own = chunks.plan(api, inputs.args, inputs.kwargs, out_shape)
    if bench_chunking is None or own is None or any(id(t) not in own.split for _, t in wanted):
        return None
    positions, fn = frozenset(p for p, _ in wanted), item.where.resolved.bench_fn
    plans = []
    for position, _ in wanted:
        gradient = chunks.Gradient(position, positions, grad)
        runs = [chunks.RunSpec("b", fn, bench_chunking, bench_dtype, device=bench, gradient=gradient)]
        if options.standard == "strict":
            runs.append(chunks.RunSpec("t", fn, own, own_dtype, autocast=item.plan.autocast, device=bench,
                                       gradient=gradient))
        plans.append(Plan(runs, 0, 0, "torch", f"torch's kernel on {bench}, device dtype"
                          if options.standard == "strict" else None, None, position=position))
    return plans


def _magnitude_label(bench_device: str) -> str:
    return "magnitude: the API on |inputs| in fp32" + ("" if bench_device == "cpu" else f" on {bench_device}")


def pieces_for(item: Any) -> list[Plan] | None:
    """The memory stage of a re-run item's runs: None where its whole check fits its budget; else how each output
    (a forward item's one, a backward item's gradients) is checked a block of rows at a time (the record says
    so), or NotCheckable with the reason. By default an item that cannot be cut still runs whole where the host
    has room for it."""
    need = need_of(item)
    if need is None:
        return None
    room, explicit = budget(item.options), item.options.max_memory is not None
    limit = room if explicit or need <= min(room, FLOOR) else default_budget(item, room)
    memory.estimated(need, limit)  # a worker killed while this item runs is named with it (session/inflight.py)
    if need <= limit:
        return None
    try:
        pieces = _cut(item, need, limit, "--msprobe-max-memory" if explicit else
                      f"by default {HEADROOM}x the dump's largest call, {gib(item.dump.largest_call())}")
    except NotCheckable as why:
        if explicit:
            raise
        if need > room:
            raise NotCheckable(f"{why}; nor does it fit whole in the {gib(room)} the host has free (less a margin, "
                               "shared by the workers)") from None
        item.record.notes.append(f"checked whole, within the {gib(room)} the host has free: {why}")
        return None
    record = item.record
    record.pieces = {"rows": min(p.rows for p in pieces), "columns": min(p.columns for p in pieces),
                     "blocks": sum(len(chunks.blocks(p.specs[0].chunking.rows, p.rows, p.specs[0].chunking.multiple))
                                   for p in pieces), "budget": limit, "need": need}
    record.notes.append(f"checked in pieces of {record.pieces['rows']} rows: the whole check needs about "
                        f"{gib(need)}, over the memory budget of {gib(limit)}")
    return pieces


def default_budget(item: Any, room: int) -> int:
    """The default budget: what keeps this process within HEADROOM times its dump's largest call's own tensors
    (inputs, outputs, gradients in and out), given what it holds now (the inputs made) and the device's outputs
    still to come (a backward item's: its forward output, its gradients and its inputs' clones); at least FLOOR,
    at most `room` (what the host has free)."""
    outputs = tensor_bytes(item.forward.get("output"))
    if item.want_grad:
        grads = item.backward_entry.get("output") if isinstance(item.backward_entry, dict) else None
        outputs += tensor_bytes(grads) * 2
    aim = int(HEADROOM * item.dump.largest_call()) - memory.resident_bytes() - outputs
    return min(room, max(FLOOR, aim))


def need_of(item: Any) -> int | None:
    """Bytes the item's whole check holds beside the device side (`memory_need`), None where its first output's
    shape or dtype is not recorded."""
    from . import precision

    options, specs, inputs, api = item.options, item.specs, item.inputs, item.name.api_name
    out_shape = first_output_shape(item.forward.get("output"))
    out_dtype = first_output_dtype(item.forward.get("output"))
    if out_shape is None or out_dtype is None:
        return None
    bench_dtype = precision.bench_dtype(item.plan)
    wide = bench_dtype(torch.empty(0, dtype=out_dtype))
    runs = [(inputs.args, inputs.kwargs, bench_dtype, False)]  # the bench's arguments: the inputs' sizes
    if options.standard == "strict":  # the third run: the magnitude run's |inputs| for a contraction, else torch's
        magnitude = error_kind(api, specs) == "contraction"
        runs.append((inputs.args, inputs.kwargs, _wide if magnitude else own_dtype, magnitude))
    # a backward item holds each side's graph and gradients too: 4x its forward's (a linear's, measured: 3.2x)
    return memory_need(runs, math.prod(out_shape), wide.itemsize) * (4 if item.want_grad else 1)


def _cut(item: Any, need: int, limit: int, whose: str) -> list[Plan]:
    """Each output's plan in pieces within `limit` (`whose` budget it is), or NotCheckable with the reason."""
    from . import precision

    api, record = item.name.api_name, item.record
    why = f"{api}: its check needs about {gib(need)} beside the device side, over the memory budget of " \
          f"{gib(limit)} ({whose})"
    bench_dtype = precision.bench_dtype(item.plan)
    notes: list[str] = []
    if item.want_grad:
        pieces = plan_gradients(item, bench_dtype, notes)
        if pieces is None:
            raise NotCheckable(f"{why}, and its gradients are not cut in pieces (those are a linear's or matmul's "
                               "input and weight gradients, and a pointwise op's, softmax's or norm's of the tensors "
                               "cut with its rows, not a sum over rows)")
    else:
        bench_args, bench_kwargs = precision.bench_arguments(api, item.inputs, item.plan, item.options, item.specs,
                                                             notes)
        forward = plan_runs(item, bench_args, bench_kwargs, bench_dtype,
                            first_output_shape(item.forward.get("output")))
        if forward is None:
            raise NotCheckable(f"{why}, and its output's rows are not independent: not checked in pieces")
        pieces = [forward]
    for piece in pieces:
        piece.rows, piece.columns = piece_plan(piece.specs, limit, whose)
    record.notes += notes
    return pieces


def own_dtype(t: torch.Tensor) -> torch.dtype:
    """A tensor's own dtype, as a run in the device's dtypes computes it."""
    return t.dtype


def _wide(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.dtype == torch.float64 or not t.is_floating_point() else torch.float32


__all__ = ["Plan", "budget", "own_dtype", "memory_need", "piece_plan", "pieces_for", "plan_runs"]
