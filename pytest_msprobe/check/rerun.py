"""The device source of a re-run item: the API runs again on the device under test (torch), beside the bench.

Its stages (protocol.py), each one call: the entries; where each side runs (placement.py); the inputs, with what
precision each side computes in and what rounding the inputs get (precision.py); the runs, whole (execute.Runs) or
a block of rows at a time where the whole check does not fit (`Pieces`, chunked.py); how outputs are compared
(`compare_item`, through compare.py).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..dump.reader import Dump
from ..records.record import Record
from ..runs import capture
from ..runs.execution import NotCheckable, seed_random_apis
from ..runs.third_run import ReferenceRun, bench_product
from ..settings import CheckOptions
from ..specs.loader import in_list
from . import chunked, execute, placement, precision
from .calls import ApiFailure, device_backward, finish_record, has_scalar_operand
from .compare import start_metrics
from .execute import Outputs, Sides
from .kinds import Comparison, compare_outputs
from .placement import may_draw
from .prepare import checkable_entries, encoded_arguments, prepared_inputs
from .source import DeviceSource, Item, RunsStrategy

__all__ = ["ApiFailure", "TorchRerun", "may_draw"]


class TorchRerun(DeviceSource):
    """The device's result: the API run again here, on --msprobe-device (the default source)."""

    @classmethod
    def applies(cls, dump: Dump, options: CheckOptions) -> bool:
        return True

    def item(self, dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any], record: Record,
             shared: Any) -> Item:
        return Item(dump, name, options, specs, record, shared)

    def entries(self, item: Any) -> None:
        item.args_enc, item.kwargs_enc = entries(item)

    def placement(self, item: Any) -> None:
        item.where = placement.place(item.name, item.options, item.specs, item.forward, item.record)

    def inputs(self, item: Any) -> None:
        item.started = time.perf_counter()
        item.inputs = prepared_inputs(item)

    def precision(self, item: Any) -> None:
        api, record = item.name.api_name, item.record
        item.plan = precision.plan(api, item.inputs, item.forward, item.specs, item.options)
        item.inputs = precision.round_inputs(api, item.inputs, item.plan.hf32, item.where.device, item.specs,
                                             record.notes)
        item.where = placement.place_bench(item.where, item.options, item.plan, item.inputs, record)

    def runs(self, item: Any) -> RunsStrategy:
        """In pieces where the whole check does not fit its memory budget (chunked.py), else whole."""
        pieces = chunked.pieces_for(item)
        if pieces is not None:
            return Pieces(item, pieces)
        inputs, where = item.inputs, item.where
        capture.stash(args=inputs.args, kwargs=inputs.kwargs, requires_grad=inputs.requires_grad,
                      cotangents=inputs.cotangents, plan=item.plan, device=where.device, name=item.name,
                      want_grad=item.want_grad, resolved=where.resolved)  # --msprobe-save-error-data/-repro/-fuzz
        sides = make_sides(item)
        item.record.timings["inputs_s"] = time.perf_counter() - item.started
        return Whole(item, sides, execute.Runs(item, sides, *execute.third_runs(item)))

    def finish(self, item: Item) -> None:
        finish_record(item.record)  # looked up here: benchmarks/run_probe.py times it as rerun.finish_record


class Whole(RunsStrategy):
    """The whole check at once: device, bench, third run and magnitude run (execute.Runs), then `compare_item`."""

    def __init__(self, item: Item, sides: Sides, runs: execute.Runs) -> None:
        self.item, self.sides, self.runs = item, sides, runs

    @contextmanager
    def guarded(self) -> Iterator[None]:
        with self.runs.guarded():
            yield

    def run(self) -> Outputs:
        return self.runs.run()

    def compare(self, outputs: Outputs) -> None:
        started = time.perf_counter()
        compare_item(self.item, self.sides, self.runs.reference, outputs)
        self.item.record.timings["compare_s"] = time.perf_counter() - started


class Pieces(RunsStrategy):
    """The device's run, whole, on the inputs themselves where it cannot write them (`item.shared`; no bench side
    is made), and for a backward item its backward; then the bench's runs and the checks of each output (a
    forward item's one, a backward item's gradients) a block of rows at a time (kinds.InPieces)."""

    def __init__(self, item: Item, pieces: list[chunked.Plan]) -> None:
        self.item, self.pieces = item, pieces
        unmade = placement.BenchSide([], {}, chunked.own_dtype, item, False)  # never made: the pieces make their own
        placement.share(item, False)
        if item.shared is not None:  # the pieces read the inputs after the device's run: it writes into copies
            item.shared.give = False
        device = placement.device_side(item.inputs, item.where, item.want_grad, item.shared)
        self.runs = execute.Runs(item, Sides(device, unmade, False), None, None)

    @contextmanager
    def guarded(self) -> Iterator[None]:
        with self.runs.guarded():
            yield

    def run(self) -> list[torch.Tensor]:
        """The device's outputs as the pieces compare them: its one float output, or its gradients, in the order of
        the pieces; else NotCheckable."""
        item = self.item
        seed_random_apis(item.record.seed, item.where.device)
        leaves = self.runs.device_forward().leaves_d
        if item.want_grad:
            device_backward(item, leaves)
            del leaves  # the forward output: only the gradients are compared
            grads = {pos: leaf.grad for pos, leaf in self.runs.sides.device.grad_leaves if leaf.grad is not None}
            compared = [p.position for p in self.pieces]
            if list(grads) != compared:
                raise NotCheckable(f"{item.name.full_name}: the device gave gradients of tensor arguments "
                                   f"{list(grads)}, the pieces compare {compared}")
            return list(grads.values())
        if len(leaves) != 1 or not isinstance(leaves[0], torch.Tensor) or not leaves[0].is_floating_point():
            raise NotCheckable(f"{item.name.api_name}: the device returned {len(leaves)} outputs, not one float "
                               "tensor: not checked in pieces, and the whole check does not fit the memory budget")
        return [leaves[0]]

    def compare(self, outputs: list[torch.Tensor]) -> None:
        item, record = self.item, self.item.record
        started = time.perf_counter()
        direction = "backward" if item.want_grad else "forward"
        for pieces, output in zip(self.pieces, outputs):
            compare_outputs(Comparison(record, f"{item.name.full_name}.{direction}.output", [], [output], None,
                                       pieces.role, item.name.api_name, item.specs, item.options,
                                       autocast=item.plan.autocast, gradients=item.want_grad,
                                       scalar_operand=has_scalar_operand(item.inputs.args, item.inputs.kwargs),
                                       contract=item.where.contract, pieces=pieces))
        label = self.pieces[0].label
        if label is not None:
            record.reference = label
        record.timings["pieces_s"] = time.perf_counter() - started


def entries(item: Item) -> tuple[list[Any], dict[str, Any]]:
    """The entries the item checks (into `item`) and its encoded arguments; NotCheckable where its backward cannot
    be. Every source but overflow's takes this stage first."""
    name, specs = item.name, item.specs
    api = name.api_name
    item.user, item.forward, item.backward_entry = checkable_entries(item.dump, name, specs)
    args_enc, kwargs_enc = encoded_arguments(item.forward, name.full_name)
    if item.backward_entry is not None:
        if in_list(specs, api, "backward", "not_backward"):
            raise NotCheckable(f"{api}: no backward input data is recorded for this API")
        if in_list(specs, api, "backward", "unsupported"):
            raise NotCheckable(f"{api}: backward of this API is not checkable")
        if "out" in kwargs_enc:
            raise NotCheckable(f"{api}: called with out=..., which does not support autograd")
    return args_enc, kwargs_enc


def make_sides(item: Item) -> Sides:
    """The device's side, and the bench's (made here unless it runs beside the device): who shares what."""
    name, options, specs, plan, inputs = item.name, item.options, item.specs, item.plan, item.inputs
    beside = placement.bench_beside(name, inputs.kwargs, options, specs)
    placement.share(item, beside)
    device_side = placement.device_side(inputs, item.where, item.want_grad, item.shared)
    bench_args, bench_kwargs = precision.bench_arguments(name.api_name, inputs, plan, options, specs,
                                                         item.record.notes)
    bench_side = placement.BenchSide(bench_args, bench_kwargs, precision.bench_dtype(plan), item, beside)
    if not beside:
        bench_side()
    return Sides(device_side, bench_side, beside)


def compare_item(item: Item, sides: Sides, reference: ReferenceRun | None, out: Outputs) -> None:
    """Which outputs pair up: a forward item's outputs, or a backward item's gradients, each pair with the bench's
    and the third run's; each kind of output compares itself (kinds.compare_outputs)."""
    record, options, specs, api, full = item.record, item.options, item.specs, item.name.api_name, item.name.full_name
    where, plan, inputs = item.where, item.plan, item.inputs
    role = reference.role if reference is not None else "torch"
    if item.backward_entry is None:
        product = bench_product(api, sides.bench(), out.leaves_b, specs) if role == "magnitude" else None
        compare_outputs(Comparison(record, f"{full}.forward.output", out.leaves_b, out.leaves_d, out.leaves_r, role,
                                   api, specs, options, product=product, autocast=plan.autocast,
                                   scalar_operand=has_scalar_operand(inputs.args, inputs.kwargs), early=out.early,
                                   contract=where.contract, summed=out.summed,
                                   validity=(api, sides.device.args, sides.device.kwargs)))
        return
    grads_b = [leaf.grad for _, leaf in sides.bench().grad_leaves]
    grads_d = [leaf.grad for _, leaf in sides.device.grad_leaves]
    positions = [pos for pos, _ in sides.device.grad_leaves]
    prefix = f"{full}.backward.output"
    early = out.early if sides.beside else start_metrics(prefix, grads_b, grads_d, api, specs, options)
    grads_r = estimated = None
    if reference is not None and reference.side is not None and out.leaves_r is not None:
        grads_r, estimated = reference.complete([leaf.grad for _, leaf in reference.side.grad_leaves],
                                                grads_b, [pos for pos, _ in reference.side.grad_leaves])
    compare_outputs(Comparison(record, prefix, grads_b, grads_d, grads_r, role, api, specs, options, positions,
                               autocast=plan.autocast, gradients=True, estimated=estimated, early=early,
                               contract=where.contract, summed=out.summed))
