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
from typing import Any, Callable

import torch

from ..dump.reader import Dump
from ..metrics.vectorised import blank_metrics
from ..runs import backends, capture, kernels
from ..runs.backends import select as select_device
from ..runs.execution import (
    NotCheckable,
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


def run_overflow_check(dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any],
                       record: dict[str, Any]) -> None:
    """check.check_entry's run for an overflow_check dump: fills `record` or raises its skip/error."""
    from .calls import backward_both
    from .calls import timed as _timed
    from .prepare import checkable_entries, encoded_arguments, prepared_inputs, start_prefetch

    api = name.api_name
    if dump.framework != "pytorch":
        raise NotCheckable(f"overflow triage replays PyTorch dumps (framework {dump.framework!r})")
    user, forward, backward_entry = checkable_entries(dump, name, specs)
    want_grad = backward_entry is not None
    args_enc, kwargs_enc = encoded_arguments(forward, name.full_name)
    if want_grad and ("out" in kwargs_enc or in_list(specs, api, "backward", "unsupported")):
        raise NotCheckable(f"{api}: backward of this call is not checkable")

    device = select_device(options.device, options.device_index)
    resolved = kernels.substitute(options.kernels, name.api_type, api,
                                  resolve(name.api_type, api, device, specs, forward))
    record.update(device=device.name, backend=device.label, impl=resolved.label)
    if resolved.kernel:
        record["kernel"] = resolved.kernel

    started = time.perf_counter()
    ctx, args, kwargs, cotangents = prepared_inputs(dump, api, args_enc, kwargs_enc, backward_entry, record, options,
                                                    specs)
    plan = plan_precision(api, args, kwargs, first_output_dtype(forward.get("output")), specs, options.bench_precision,
                          options.standard)
    capture.stash(args=args, kwargs=kwargs, requires_grad=ctx.requires_grad, cotangents=cotangents, plan=plan,
                  device=device, name=name, want_grad=want_grad, mode="overflow_check", resolved=resolved)

    same = lambda t: t.dtype  # noqa: E731  (no precision raise on either side)
    dev_side = make_side(args, kwargs, device=device.name, dtype_for=same, requires_grad=ctx.requires_grad,
                         want_grad=want_grad, bench=False, move=device.to_device)
    bench_side = make_side(args, kwargs, device="cpu", dtype_for=same, requires_grad=ctx.requires_grad,
                           want_grad=want_grad, bench=True)
    timings = record["timings"]
    timings["inputs_s"] = time.perf_counter() - started
    api_key, entry_name = f"{name.api_type}.{api}", f"{name.full_name}.{name.direction}"
    device_fn = backends.runner(device, api_key, resolved.device_fn)
    start_prefetch()  # the next item's inputs, in the helper thread while the API runs
    seed_random_apis(record["seed"], device)
    out_d = _timed(timings, "device_s", "device", lambda: backends.device_call(
        entry_name, api_key, "forward", device, resolved.label, lambda: run_side(
            device_fn, dev_side, autocast=plan.autocast, device_type=device.kind, grad=want_grad)), None)
    out_b = _timed(timings, "bench_s", "bench", lambda: run_side(
        resolved.bench_fn, bench_side, autocast=plan.autocast, device_type="cpu", grad=want_grad), None)
    capture.stash(out_d=out_d, out_b=out_b)
    leaves_d, leaves_b = output_leaves(out_d), output_leaves(out_b)
    prefix = f"{name.full_name}.{name.direction}.output"
    positions = None
    if want_grad:
        grad_index = user.get("grad_index", specs.get("backward", {}).get("grad_index", {}).get(api))
        backward_both(name, leaves_b, leaves_d, cotangents, grad_index, timings, device, resolved.label)
        leaves_b = [leaf.grad for _, leaf in bench_side.grad_leaves]
        leaves_d = [leaf.grad for _, leaf in dev_side.grad_leaves]
        positions = [pos for pos, _ in dev_side.grad_leaves]
    capture.stash(compared_bench=leaves_b, compared_device=leaves_d, positions=positions)
    _classify(record, prefix, leaves_b, leaves_d, positions)


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
