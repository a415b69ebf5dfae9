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
can differ from the bench. Precision metrics are not computed in this mode.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..dump.reader import Dump
from ..metrics.vectorised import blank_metrics
from ..runs import backends, capture, kernels
from ..runs.backends import select as select_device
from ..runs.execution import (
    Device,
    NotCheckable,
    Plan,
    Resolved,
    first_output_dtype,
    make_side,
    output_leaves,
    plan_precision,
    resolve,
    run_side,
    seed_random_apis,
)
from ..settings import CheckOptions
from ..specs.loader import in_list
from .source import DeviceSource, Item, RunsStrategy


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


@dataclass
class OverflowItem(Item):
    """An overflow_check item's context, as its stages fill it in."""

    args_enc: list[Any] = field(default_factory=list)
    kwargs_enc: dict[str, Any] = field(default_factory=dict)
    device: Device = field(init=False)
    resolved: Resolved = field(init=False)
    built: Any = None  # prepare.prepared_inputs: (context, args, kwargs, cotangents)
    plan: Plan = field(init=False)
    started: float = 0.0


class OverflowRun(DeviceSource):
    """The device source of an overflow_check dump: the call on the device and on the CPU, both in the recorded
    dtypes; each output classified (no precision verdict)."""

    mode = "overflow_check"
    retries = False

    @classmethod
    def applies(cls, dump: Dump, options: CheckOptions) -> bool:
        return dump.task == "overflow_check"  # REFERENCE §3.6: classify each overflow instead of judging precision

    def item(self, dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any], record: dict[str, Any],
             shared: Any) -> OverflowItem:
        return OverflowItem(dump, name, options, specs, record, shared)

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
        item.device = select_device(options.device, options.device_index)
        item.resolved = kernels.substitute(options.kernels, name.api_type, name.api_name,
                                           resolve(name.api_type, name.api_name, item.device, item.specs, item.forward))
        record.update(device=item.device.name, backend=item.device.label, impl=item.resolved.label)
        if item.resolved.kernel:
            record["kernel"] = item.resolved.kernel

    def inputs(self, item: Any) -> None:
        from .prepare import prepared_inputs

        item.started = time.perf_counter()
        item.built = prepared_inputs(item.dump, item.name.api_name, item.args_enc, item.kwargs_enc,
                                     item.backward_entry, item.record, item.options, item.specs)

    def precision(self, item: Any) -> None:
        """No precision raise on either side; the recorded AMP autocast applies to both."""
        ctx, args, kwargs, cotangents = item.built
        options = item.options
        item.plan = plan_precision(item.name.api_name, args, kwargs, first_output_dtype(item.forward.get("output")),
                                   item.specs, options.bench_precision, options.standard)
        capture.stash(args=args, kwargs=kwargs, requires_grad=ctx.requires_grad, cotangents=cotangents,
                      plan=item.plan, device=item.device, name=item.name, want_grad=item.want_grad,
                      mode="overflow_check", resolved=item.resolved)

    def runs(self, item: Any) -> RunsStrategy:
        return OverflowRuns(item)

    def finish(self, item: Item) -> None:
        """The statuses are the classification's (`_classify`)."""


def _same(t: torch.Tensor) -> torch.dtype:
    return t.dtype


class OverflowRuns(RunsStrategy):
    """The device's run and the bench's in the recorded dtypes, and their backward; each output classified."""

    def __init__(self, item: OverflowItem) -> None:
        ctx, args, kwargs, _ = item.built
        device, want_grad = item.device, item.want_grad
        self.item = item
        self.dev_side = make_side(args, kwargs, device=device.name, dtype_for=_same, requires_grad=ctx.requires_grad,
                                  want_grad=want_grad, bench=False, move=device.to_device)
        self.bench_side = make_side(args, kwargs, device="cpu", dtype_for=_same, requires_grad=ctx.requires_grad,
                                    want_grad=want_grad, bench=True)
        item.record["timings"]["inputs_s"] = time.perf_counter() - item.started

    def run(self) -> tuple[list[Any], list[Any], list[int] | None]:
        """The bench's and the device's outputs (a backward item's: gradients), and the gradients' positions."""
        from .calls import backward_both
        from .calls import timed as _timed
        from .prepare import start_prefetch

        item, name, device, resolved, plan = self.item, self.item.name, self.item.device, self.item.resolved, \
            self.item.plan
        record, want_grad, timings = item.record, item.want_grad, item.record["timings"]
        api_key, entry_name = f"{name.api_type}.{name.api_name}", f"{name.full_name}.{name.direction}"
        device_fn = backends.runner(device, api_key, resolved.device_fn)
        start_prefetch()  # the next item's inputs, in the helper thread while the API runs
        seed_random_apis(record["seed"], device)
        out_d = _timed(timings, "device_s", "device", lambda: backends.device_call(
            entry_name, api_key, "forward", device, resolved.label, lambda: run_side(
                device_fn, self.dev_side, autocast=plan.autocast, device_type=device.kind, grad=want_grad)), None)
        out_b = _timed(timings, "bench_s", "bench", lambda: run_side(
            resolved.bench_fn, self.bench_side, autocast=plan.autocast, device_type="cpu", grad=want_grad), None)
        capture.stash(out_d=out_d, out_b=out_b)
        leaves_d, leaves_b = output_leaves(out_d), output_leaves(out_b)
        if not want_grad:
            return leaves_b, leaves_d, None
        grad_index = item.user.get("grad_index", item.specs.get("backward", {}).get("grad_index", {}).get(name.api_name))
        backward_both(name, leaves_b, leaves_d, item.built[3], grad_index, timings, device, resolved.label)
        return ([leaf.grad for _, leaf in self.bench_side.grad_leaves],
                [leaf.grad for _, leaf in self.dev_side.grad_leaves], [pos for pos, _ in self.dev_side.grad_leaves])

    def compare(self, outputs: tuple[list[Any], list[Any], list[int] | None]) -> None:
        leaves_b, leaves_d, positions = outputs
        name = self.item.name
        capture.stash(compared_bench=leaves_b, compared_device=leaves_d, positions=positions)
        _classify(self.item.record, f"{name.full_name}.{name.direction}.output", leaves_b, leaves_d, positions)


def _classify(record: dict[str, Any], prefix: str, bench: list[Any], device: list[Any],
              positions: list[int] | None) -> None:
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
        record["outputs"].append({
            "name": name, "status": status, "message": message, "bench_dtype": dtype(b), "device_dtype": dtype(d),
            "shape": list(d.shape) if isinstance(d, torch.Tensor) else None, "metrics": blank_metrics(),
            "worst": None, "verdict": status, "verdict_message": message,
            "overflow": {"verdict": verdict, "device": over_d, "bench": over_b, "device_inf": inf_d,
                         "device_nan": nan_d, "bench_inf": inf_b, "bench_nan": nan_b},
        })
        verdicts.append(verdict)
    if not record["outputs"]:
        raise NotCheckable(f"{prefix}: no floating-point output to check for overflow")
    bad = [o for o in record["outputs"] if o["status"] == "error"]
    record["status"] = "error" if bad else "pass"
    record["layer1_status"] = record["status"]
    overall = "abnormal" if bad else ("normal" if "normal" in verdicts else "not reproduced")
    record["overflow"] = overall
    record["message"] = "; ".join(f"{o['name'].rsplit('.', 2)[-2]}.{o['name'].rsplit('.', 1)[-1]}: {o['message']}"
                                  for o in (bad or record["outputs"][:1]))
