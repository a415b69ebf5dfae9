"""Overflow triage for dumps of task `overflow_check` (REFERENCE §3.6, §9.1).

msprobe's overflow dump holds only the calls that overflowed on the device. Each item replays its
call on the device under test and on the CPU, both in the recorded dtypes (no precision raise, as
msprobe's `run_overflow_check`; the recorded AMP autocast applies to both), and classifies every
floating-point output (forward) or gradient (backward):

* overflowing on the bench too, at the same positions: **normal** — the math overflows in that dtype;
  the item passes;
* overflowing only on the device, or at positions where the bench is finite: **abnormal** — a
  device-specific overflow; the item fails (msprobe compares one flag per tensor; the positions catch
  a device that overflows early in a tensor where the math overflows elsewhere too);
* overflowing only on the bench: the device saturated or dropped an inf the math produces; msprobe
  calls a difference in flags abnormal too, so the item fails and says which side;
* neither: the overflow was not reproduced (inputs from statistics rarely hit it); the item passes and
  says so.

"Overflow" is any inf or NaN in a non-empty floating-point tensor, or a non-finite Python float
(msprobe's CPU rule); bool and integer outputs cannot overflow. On a CPU-only machine the device is
the CPU in the recorded dtype, so only a substituted kernel (`--msprobe-kernels`) or a device backend
can differ from the bench. Precision metrics are not computed in this mode. The classification is an output
kind of its own (kinds.Overflow).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from ..dump.reader import Dump
from ..records.record import Record
from ..runs import backends, capture, kernels
from ..runs.backends import select as select_device
from ..runs.execution import NotCheckable, Target, make_side, output_leaves, resolve, run_side, seed_random_apis
from ..settings import CheckOptions
from ..specs.loader import in_list
from . import precision
from .kinds import Comparison, compare_outputs
from .placement import Placement
from .source import DeviceSource, Item, RunsStrategy


class OverflowRun(DeviceSource):
    """The device source of an overflow_check dump: the call on the device and on the CPU, both in the recorded
    dtypes; each output classified (no precision verdict)."""

    mode = "overflow_check"
    retries = False

    @classmethod
    def applies(cls, dump: Dump, options: CheckOptions) -> bool:
        return dump.task == "overflow_check"  # REFERENCE §3.6: classify each overflow instead of judging precision

    def item(self, dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any], record: Record,
             shared: Any) -> Item:
        return Item(dump, name, options, specs, record, shared)

    def entries(self, item: Any) -> None:
        from .prepare import checkable_entries, encoded_arguments

        dump, name, specs, api = item.dump, item.name, item.specs, item.name.api_name
        if dump.framework != "pytorch":
            raise NotCheckable(f"overflow triage replays PyTorch dumps (framework {dump.framework!r})")
        item.user, item.forward, item.backward_entry = checkable_entries(dump, name, specs)
        item.args_enc, item.kwargs_enc = encoded_arguments(item.forward, name.full_name)
        if item.want_grad and ("out" in item.kwargs_enc or in_list(specs, api, "backward", "unsupported")):
            raise NotCheckable(f"{api}: backward of this call is not checkable")

    def placement(self, item: Any) -> None:
        name, options, record = item.name, item.options, item.record
        device = select_device(options.device, options.device_index)
        resolved = kernels.substitute(options.kernels, name.api_type, name.api_name,
                                      resolve(name.api_type, name.api_name, device, item.specs, item.forward))
        record.device, record.backend, record.impl = device.name, device.label, resolved.label
        if resolved.kernel:
            record.kernel = resolved.kernel
        item.where = Placement(device, resolved, "torch")  # no contract: nothing is judged for precision

    def inputs(self, item: Any) -> None:
        from .prepare import prepared_inputs

        item.started = time.perf_counter()
        item.inputs = prepared_inputs(item)

    def precision(self, item: Any) -> None:
        """No precision raise on either side; the recorded AMP autocast applies to both."""
        inputs = item.inputs
        item.plan = precision.plan(item.api, inputs, item.forward, item.specs, item.options)
        capture.stash(args=inputs.args, kwargs=inputs.kwargs, requires_grad=inputs.requires_grad,
                      cotangents=inputs.cotangents, plan=item.plan, device=item.where.device, name=item.name,
                      want_grad=item.want_grad, mode="overflow_check", resolved=item.where.resolved)

    def runs(self, item: Any) -> RunsStrategy:
        return OverflowRuns(item)

    def finish(self, item: Item) -> None:
        """The statuses are the classification's (kinds.Overflow)."""


def _same(t: torch.Tensor) -> torch.dtype:
    return t.dtype


class OverflowRuns(RunsStrategy):
    """The device's run and the bench's in the recorded dtypes, and their backward; each output classified."""

    def __init__(self, item: Item) -> None:
        (args, kwargs, _, requires_grad), device, want_grad = item.inputs, item.where.device, item.want_grad
        self.item = item
        self.dev_side = make_side(args, kwargs, target=Target(device.name, _same, False, device.to_device),
                                  requires_grad=requires_grad, want_grad=want_grad)
        self.bench_side = make_side(args, kwargs, target=Target("cpu", _same, True), requires_grad=requires_grad,
                                    want_grad=want_grad)
        item.record.timings["inputs_s"] = time.perf_counter() - item.started

    def run(self) -> tuple[list[Any], list[Any], list[int] | None]:
        """The bench's and the device's outputs (a backward item's: gradients), and the gradients' positions."""
        from .calls import backward_both
        from .calls import timed as _timed
        from .prepare import start_prefetch

        item = self.item
        name, device, resolved, plan = item.name, item.where.device, item.where.resolved, item.plan
        record, want_grad, timings = item.record, item.want_grad, item.record.timings
        api_key, entry_name = f"{name.api_type}.{name.api_name}", f"{name.full_name}.{name.direction}"
        device_fn = backends.runner(device, api_key, resolved.device_fn)
        start_prefetch()  # the next item's inputs, in the helper thread while the API runs
        seed_random_apis(record.seed, device)
        out_d = _timed(timings, "device_s", "device", lambda: backends.device_call(
            entry_name, api_key, "forward", device, resolved.label, lambda: run_side(
                device_fn, self.dev_side, autocast=plan.autocast, device_type=device.kind, grad=want_grad)), None)
        out_b = _timed(timings, "bench_s", "bench", lambda: run_side(
            resolved.bench_fn, self.bench_side, autocast=plan.autocast, device_type="cpu", grad=want_grad), None)
        capture.stash(out_d=out_d, out_b=out_b)
        leaves_d, leaves_b = output_leaves(out_d), output_leaves(out_b)
        if not want_grad:
            return leaves_b, leaves_d, None
        backward_both(item, leaves_b, leaves_d)
        return ([leaf.grad for _, leaf in self.bench_side.grad_leaves],
                [leaf.grad for _, leaf in self.dev_side.grad_leaves], [pos for pos, _ in self.dev_side.grad_leaves])

    def compare(self, outputs: tuple[list[Any], list[Any], list[int] | None]) -> None:
        leaves_b, leaves_d, positions = outputs
        item = self.item
        compare_outputs(Comparison(item.record, f"{item.name.full_name}.{item.name.direction}.output", leaves_b,
                                   leaves_d, None, "torch", item.name.api_name, item.specs, item.options, positions,
                                   overflow=True))
