"""Where each side runs: the device under test and its kernels (--msprobe-device, --msprobe-kernels), the
bench on the CPU, in the items' thread or beside it in the helper thread, and which inputs the sides share
without a copy. Each side is made here (make_side), the bench's on first use.

Apart from precision.py (what each side computes in) and execute.py (which runs there are, and running them):
these choices depend on the device, the threads and the call's writes, not on the standard's error model.
"""
from __future__ import annotations

import time
from typing import Any, NamedTuple

from ..records.record import Record
from ..runs import backends, bench_device, capture, kernels
from ..runs.backends import select as select_device
from ..runs.execution import Device, Resolved, Shared, Side, Target, make_side, resolve, tensors_of
from ..runs.sharing import may_grow, written_inputs
from ..settings import CheckOptions
from ..specs.loader import in_list
from ..verdict import contracts
from .precision import Inputs


class Placement(NamedTuple):
    """The device under test, the API's callables on each side, the device's accuracy contract, and where the
    bench, the third run and the magnitude run compute (`bench`: a torch device, msprobe_bench_device)."""

    device: Device
    resolved: Resolved
    contract: str
    bench: str = "cpu"


def place_bench(where: Placement, options: CheckOptions, plan: Any, inputs: Inputs,
                record: Record) -> Placement:
    """The bench's device for this call (runs/bench_device.py: an fp64 bench where the device has fp64, else on
    the CPU); the record's `bench_device` says where and in what."""
    on = bench_device.placement(options.bench_device, plan.raise_to, [t.dtype for t in tensors_of(inputs.args)])
    record.bench_device = bench_device.describe(on, plan.raise_to)
    if on != options.bench_device and options.bench_device != "cpu":
        record.notes.append(f"the bench computes in fp64, which {options.bench_device} does not have: it ran on "
                               "the cpu")
    return where._replace(bench=on)


def place(name: Any, options: CheckOptions, specs: dict[str, Any], forward: dict[str, Any],
          record: Record) -> Placement:
    """The device (--msprobe-device) and the API's callables there, your kernels substituted; the record says
    which."""
    api = name.api_name
    device = select_device(options.device, options.device_index)
    resolved = resolve(name.api_type, api, device, specs, forward)
    resolved = kernels.substitute(options.kernels, name.api_type, api, resolved)  # --msprobe-kernels
    record.device = device.name
    record.backend = device.label
    contract = record.contract = contracts.resolve(options.contract, device.kind)
    record.impl = resolved.label
    if resolved.kernel:
        record.kernel = resolved.kernel
    if resolved.reference_vs_reference:
        record.reference_only = True  # counted apart: such a pass says nothing about a vendor kernel
        record.notes.append("reference-vs-reference: the device side runs the bench function in the recorded "
                               "dtype, not a vendor kernel")
    return Placement(device, resolved, contract)


def may_draw(api: str, kwargs: dict[str, Any], specs: dict[str, Any]) -> bool:
    """Whether a call may draw from torch's CPU generator: a random or dropout API, or a dropout-like argument."""
    return api in specs.get("dropout_apis", []) or in_list(specs, api, "random_apis") or \
        any("dropout" in key or key in ("p", "keep_prob", "generator", "training") for key in kwargs)


def bench_beside(name: Any, kwargs: dict[str, Any], options: CheckOptions, specs: dict[str, Any]) -> bool:
    """Whether the bench (forward and backward) runs in the helper thread beside the device and the third run:
    with a spare core, unless the call may draw random numbers (device and third run draw the same ones from the
    one CPU generator) or is an NPU op (its outputs are post-processed before its backward)."""
    return options.work_threads > 1 and name.api_type != "NPU" and not may_draw(name.api_name, kwargs, specs)


def share(item: Any, beside: bool) -> None:
    """Which of an item's inputs (source.Item) the sides on the CPU take without a copy: those the call cannot
    write."""
    shared, name, inputs = item.shared, item.name, item.inputs
    if shared is None:
        return
    api = name.api_name
    shared.written = written_inputs(name.api_type, api, item.where.resolved.bench_fn, inputs.args, inputs.kwargs,
                                    item.specs)
    # the inputs are read after the runs; a drawn tensor's storage cannot grow; a bench beside the device
    # makes its side in the helper thread, and reads there every input as it was drawn
    shared.give = not beside and not capture.active() and name.api_type != "NPU" and \
        not may_grow(api, inputs.args, inputs.kwargs, shared.written, item.forward.get("output"))


def device_side(inputs: Inputs, where: Placement, want_grad: bool, shared: Shared | None) -> Side:
    """The device's side: the inputs in their own dtypes on the device (moved by its backend, if it has its own)."""
    device = where.device
    plain = device.backend is None or type(device.backend).to_device is backends.Backend.to_device
    return make_side(inputs.args, inputs.kwargs,
                     target=Target(device.name, lambda t: t.dtype, False, None if plain else device.to_device,
                                   shared=None if where.resolved.kernel else shared),  # a kernel may write behind torch's back
                     requires_grad=inputs.requires_grad, want_grad=want_grad)


class BenchSide:
    """The bench's side on the CPU, made on first use: in the helper thread when the bench runs there, which
    takes its casts to fp32 and fp64 (an item's largest copies) off the items' thread. No side holds a written
    input as drawn then (`shared.give`), so that the helper may read every input while the device runs."""

    def __init__(self, args: list[Any], kwargs: dict[str, Any], dtype_for: Any, item: Any, beside: bool) -> None:
        """The bench's arguments and dtype per tensor, for an item (source.Item) whose placement and inputs are
        set."""
        self.args, self.kwargs, self.dtype_for, self.on = args, kwargs, dtype_for, item.where.bench
        self.requires_grad, self.want_grad, self.shared = item.inputs.requires_grad, item.want_grad, item.shared
        self.beside, self.timings = beside, item.record.timings
        self.made: list[Side] = []

    def __call__(self) -> Side:
        if not self.made:
            began = time.perf_counter()
            on_cpu = self.on == "cpu"
            self.made.append(make_side(self.args, self.kwargs,
                                       target=Target(self.on, self.dtype_for, on_cpu,
                                                     shared=self.shared if on_cpu else None),
                                       requires_grad=self.requires_grad, want_grad=self.want_grad))
            if self.beside:
                self.timings["inputs_beside_s"] = time.perf_counter() - began
        return self.made[0]
