"""Which runs an item has, and running them: the device's run (inside the device-call boundary that plugins
wrap), the bench's, the third run and the magnitude run (runs/third_run.py), and a backward item's backward
passes; with a spare core the bench, and a CPU third run queued behind it, run in the helper thread beside the
device.

Apart from placement.py (which decides where each side runs) because this module owns the threads' order:
what is submitted when, who takes a queued run back, and whose failure is reported.
"""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from ..helper import helper
from ..runs import backends, bench_device, capture, schemes
from ..runs.execution import (
    NotCheckable,
    Side,
    backward,
    broken_precondition,
    first_output_shape,
    output_leaves,
    pair_cotangents,
    run_side,
    seed_random_apis,
)
from ..runs.terms import terms_run
from ..runs.third_run import ReferenceRun, RunInputs, Summed, summed_outputs, summed_run, third_run
from . import calls
from .calls import ApiFailure, bench_backward, bench_raw, device_backward, same_threads, selected
from .compare import EarlyMetrics, start_metrics
from .placement import BenchSide
from .prepare import build_pending_here, start_prefetch, terms_scale
from .source import Item


@dataclass(frozen=True)
class Sides:
    """The device's side, the bench's (made on first use), and whether the bench runs in the helper thread."""

    device: Side
    bench: BenchSide
    beside: bool


@dataclass
class Outputs:
    """What the runs gave: each side's outputs (`leaves_*`: the compared ones), the third run's, the magnitude
    run's sums, msprobe's metrics started early, and how many outputs each backward paired."""

    out_d: Any
    leaves_d: list[Any]
    out_b: Any = None
    leaves_b: list[Any] = field(default_factory=list)
    leaves_r: list[Any] | None = None
    early: EarlyMetrics | None = None
    summed: tuple[list[Any], str] | None = None
    pairs_b: int = 0
    pairs_d: int = 0


def third_runs(item: Item) -> tuple[ReferenceRun | None, Summed | None]:
    """The runs beside device and bench: the third run (a reference device's, torch's own or the magnitude
    run) and the magnitude run of sums (or the terms run of a composite the contract bounds by its terms), each
    None where the standard uses none."""
    return third_run(item.options, item.where.resolved, item.name, item.specs, item.plan, run_inputs(item)), \
        bounding_run(item)


def run_inputs(item: Item) -> RunInputs:
    """The item's inputs as a run beside the bench takes them."""
    inputs = item.inputs
    return RunInputs(inputs.args, inputs.kwargs, inputs.requires_grad, item.want_grad, item.shared, item.where.bench)


def bounding_run(item: Item) -> Summed | None:
    """The run that bounds an item's outputs by the size of their terms, where any exists: the magnitude run of a
    sum or fused multiply-add (third_run.summed_run), sized by the contract's scheme of the kernel where it names
    one (runs/schemes.py), else the terms run of a composite the contract bounds so."""
    options, api, specs, where, inputs = item.options, item.api, item.specs, item.where, item.inputs
    summed = summed_run(options, where.resolved, api, specs, run_inputs(item),
                        first_output_shape(item.forward.get("output")))
    if summed is not None:  # a kernel scheme the contract names (embedding's blocks in bf16) sizes it instead
        return schemes.blocked(summed, specs, where.contract, api, (inputs.args, inputs.kwargs), inputs.cotangents)
    scale = terms_scale(options, where.contract, api, specs, inputs.args, item.want_grad)
    return None if scale is None else terms_run(api, scale, run_inputs(item))


def forward_outputs(item: Item, run: ReferenceRun, key: str) -> tuple[Any, list[Any]]:
    """A run's forward (the bench's, the third run's, a magnitude run's), timed under `key`: its outputs, and those
    compared, selected as the device's are."""
    side = run.side
    assert side is not None  # None: the bench computed exactly this run
    out = calls.timed(item.record.timings, f"{key}_s", key, lambda: run_side(
        run.fn, side, autocast=run.autocast, device_type=run.device.kind, grad=item.want_grad), run.device)
    return out, selected(output_leaves(out), item.api, item.specs)


class Runs:
    """One item's runs, in the order and threads they take (`run`); `guarded` around them and the comparison."""

    def __init__(self, item: Item, sides: Sides, reference: ReferenceRun | None, summed: Summed | None) -> None:
        self.item, self.where, self.plan, self.inputs, self.sides = item, item.where, item.plan, item.inputs, sides
        self.reference, self.summed = reference, summed
        self.timings: dict[str, float] = item.record.timings
        name = item.name
        self.api_key, self.entry_name = f"{name.api_type}.{name.api_name}", f"{name.full_name}.{name.direction}"
        # The device call, and only it, runs inside the boundary (backends.device_call) that plugins wrap.
        self.device_fn = backends.runner(self.where.device, self.api_key, self.where.resolved.device_fn)
        self.threads = torch.get_num_threads()  # this thread's: the bench's CPU reductions split by it, the helper's too
        self.bench_future: Future[Any] | None = None
        self.ref_future: Future[Any] | None = None
        self.helped: list[Future[Any]] = []

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """The runs beside this thread cancelled on a failure; the record is final only once they are done. A
        timeout (a BaseException) gets a record of its own and leaves the helper to finish."""
        try:
            yield
        except BaseException as exc:
            for future in self.helped:
                future.cancel()
            if isinstance(exc, Exception):
                wait(self.helped)
            raise

    def run(self) -> Outputs:
        """Device, bench, backward, third run and magnitude run; the bench's outputs waited for."""
        self._submit()
        out = self.device_forward()
        if self.bench_future is None:
            self._bench_here(out)
        try:
            self._after_device(out)
        except Exception:
            # the runs beside this thread (not the metrics queued behind them): one thread meets the bench's
            # failure first, so is it reported
            for first in (f for f in (self.bench_future, self.ref_future) if f is not None):
                failed = None if first.cancelled() else first.exception()
                if failed is not None:
                    raise failed from None
            raise
        if self.bench_future is not None:
            self._wait_bench(out)
        capture.stash(out_d=out.out_d, out_b=out.out_b)
        if out.pairs_b != out.pairs_d:
            raise NotCheckable(f"{self.item.name.full_name}: no differentiable output pairs with a recorded gradient")
        return out

    # ------------------------------------------------------------------------- the runs, each one call

    def run_bench(self) -> Any:
        on = self.where.bench
        with bench_device.ieee_fp32(on):  # TF32/HF32 off while a bench runs on an accelerator
            return run_side(self.where.resolved.bench_fn, self.sides.bench(), autocast=None,
                            device_type=on.split(":")[0], grad=self.item.want_grad)

    def bench_runs(self, with_backward: bool) -> tuple[Any, list[Any], int]:
        """The bench's forward and, `with_backward`, its backward (beside the device: in the helper thread);
        its outputs, and how many of them took a gradient."""
        item = self.item
        same_threads(self.threads)
        self.sides.bench()  # not timed as the bench's run
        out = calls.timed(self.timings, "bench_s", "bench", self.run_bench, None)
        leaves = selected(output_leaves(out), item.name.api_name, item.specs)
        paired = self._bench_backward(leaves) if with_backward else 0
        return out, leaves, paired

    def reference_runs(self, run: ReferenceRun | None, key: str) -> list[Any] | None:
        """The third run's (or magnitude run's) forward and, for a backward item, its backward; its outputs (None
        without one)."""
        if run is None or run.side is None:
            return None
        item = self.item
        same_threads(self.threads)
        seed_random_apis(item.record.seed, run.device)  # the same random numbers as the device call
        _, leaves_r = forward_outputs(item, run, key)
        if item.backward_entry is not None:
            pairs_r = pair_cotangents(leaves_r, [run.cotangent(c) for c in self.inputs.cotangents], item.grad_index)
            calls.timed(self.timings, f"{key}_backward_s", f"{key} backward",
                        lambda: backward(leaves_r, pairs_r, run.device.name), run.device)
        return leaves_r

    def _bench_backward(self, leaves: list[Any]) -> int:
        """The bench's backward where it ran, TF32/HF32 off; how many outputs were paired."""
        with bench_device.ieee_fp32(self.where.bench):
            return bench_backward(self.item, leaves, self.where.bench)

    def _submit(self) -> None:
        """A CPU third run is queued behind the bench: the items' thread takes it back if the helper has not
        started it by the time the device is done, so whichever thread is free first runs it."""
        reference = self.reference
        if self.sides.beside:
            self.bench_future = helper().submit(self.bench_runs, self.item.want_grad)
            if reference is not None and reference.side is not None and reference.device.kind == "cpu":
                self.ref_future = helper().submit(self.reference_runs, reference, "reference")
        self.helped += [f for f in (self.bench_future, self.ref_future) if f is not None]
        if self.bench_future is None:
            start_prefetch()  # the next item's inputs, in the helper thread while the API runs
        seed_random_apis(self.item.record.seed, self.where.device)  # random APIs (dropout) replay per item

    def device_forward(self) -> Outputs:
        """The device's forward, inside the device-call boundary; a drawn input's broken precondition a skip."""
        item, where, device = self.item, self.where, self.where.device
        try:
            out_d = calls.timed(self.timings, "device_s", "device", lambda: backends.device_call(
                self.entry_name, self.api_key, "forward", device, where.resolved.label, lambda: run_side(
                    self.device_fn, self.sides.device, autocast=self.plan.autocast, device_type=device.kind,
                    grad=item.want_grad)), None)
        except ApiFailure as failure:
            reason = item.record.data == "random" and broken_precondition(
                failure.__cause__, functools.partial(bench_raw, self.bench_future) if self.bench_future
                else self.run_bench, where.resolved.bench_fn, self.sides.bench)
            if reason:
                raise NotCheckable(reason) from None
            raise
        return Outputs(out_d, selected(output_leaves(out_d), item.name.api_name, item.specs))

    def _bench_here(self, out: Outputs) -> None:
        """The bench on this thread, after the device; msprobe's metrics of a forward item started."""
        item, api, inputs = self.item, self.item.name.api_name, self.inputs
        out.out_b, out.leaves_b, _ = self.bench_runs(False)
        if item.name.api_type == "NPU":  # rows an NPU op leaves unwritten (output_postprocess, bench_functions.yaml)
            from bench_functions import postprocess
            out.leaves_d, out.leaves_b = (postprocess(api, leaves, inputs.args, inputs.kwargs, side)
                                          for leaves, side in ((out.leaves_d, "device"), (out.leaves_b, "bench")))
        # msprobe's metrics need only bench and device: with a spare core they run while the torch run does
        out.early = start_metrics(f"{item.name.full_name}.forward.output", out.leaves_b, out.leaves_d, api,
                                  item.specs, item.options) if item.backward_entry is None else None

    def _after_device(self, out: Outputs) -> None:
        """The backward passes, msprobe's metrics queued behind a bench beside, the third and magnitude runs."""
        item, name = self.item, self.item.name
        if item.backward_entry is not None:
            if not self.sides.device.grad_leaves:
                raise NotCheckable(f"{name.full_name}: no floating-point input is recorded with requires_grad=true")
            if self.bench_future is None:
                out.pairs_b = self._bench_backward(out.leaves_b)
            out.pairs_d = device_backward(item, out.leaves_d)
        if self.bench_future is not None:
            # msprobe's metrics, queued behind the bench (they need only its outputs and the device's): the
            # helper goes on to them while this thread runs the third run; then the next item's inputs
            out.early = queued_metrics(item, self.bench_future, self.sides, out.leaves_d)
            self.helped += [out.early.rows] if out.early is not None else []  # after the runs: not a run's failure
            start_prefetch()
        if self.ref_future is None or self.ref_future.cancel():  # not started in the helper yet: run here
            out.leaves_r = self.reference_runs(self.reference, "reference")
        else:
            out.leaves_r = self.ref_future.result()
        if out.leaves_r is not None and self.reference is not None:
            item.record.reference = self.reference.label
        summed = self.summed
        out.summed = summed_outputs(summed, self.reference_runs(summed.run, "magnitude") if summed else None,
                                    item.backward_entry is not None)

    def _wait_bench(self, out: Outputs) -> None:
        """The bench's outputs from the helper; the next item's inputs built here meanwhile."""
        assert self.bench_future is not None
        waited = time.perf_counter()
        if not self.bench_future.done():
            build_pending_here()  # the next item's inputs, queued behind the bench: built here while it runs
        out.out_b, out.leaves_b, out.pairs_b = self.bench_future.result()
        self.timings["bench_wait_s"] = time.perf_counter() - waited  # the items' thread's part of a bench beside it


def queued_metrics(item: Item, bench_future: Future[Any], sides: Sides, leaves_d: list[Any]) -> EarlyMetrics | None:
    """start_metrics of a bench running in the helper thread: its outputs (a backward item's: its gradients)
    are taken there once it is done, ahead in the queue."""
    full, api, specs, options = item.name.full_name, item.name.api_name, item.specs, item.options
    if item.backward_entry is not None:
        def bench() -> list[Any]:
            bench_future.result()
            return [leaf.grad for _, leaf in sides.bench().grad_leaves]

        return start_metrics(f"{full}.backward.output", bench, [leaf.grad for _, leaf in sides.device.grad_leaves],
                             api, specs, options)
    return start_metrics(f"{full}.forward.output", lambda: bench_future.result()[1], leaves_d, api, specs, options)

