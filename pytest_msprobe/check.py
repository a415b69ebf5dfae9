"""One item's whole check: rebuild inputs, run device and bench, compare, produce a record.

The record is a plain JSON-able dict so it can travel from an xdist worker to the controller
on the test report; `report.py` turns records into msprobe's CSV files.
"""
from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from . import standards
from .dump import Dump, parse_entry_name
from .execution import (
    RAISABLE, Device, NotCheckable, backward, first_output_dtype, hf32_round, make_side, output_leaves,
    pair_cotangents, plan_precision, resolve, run_side, select_device,
)
from .inputs import BuildContext, InputError, build, parse_dtype
from .seeds import item_seed
from .settings import CheckOptions
from .specs import in_list

_LOW_PRECISION = (torch.bfloat16,) + tuple(
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)
)


class ApiFailure(Exception):
    """The API raised while running; the record keeps the traceback."""


def check_entry(dump: Dump, entry_name: str, options: CheckOptions, specs: dict[str, Any]) -> dict[str, Any]:
    name = parse_entry_name(entry_name)
    record: dict[str, Any] = {
        "api": name.full_name, "direction": name.direction, "status": "SKIP", "message": "",
        "seed": item_seed(options.run_seed, name.full_name), "device": "", "impl": "", "notes": [],
        "outputs": [], "timings": {},
    }
    try:
        _run(dump, name, options, specs, record)
    except (NotCheckable, InputError) as exc:
        record["status"], record["message"] = "SKIP", str(exc)
    except ApiFailure as exc:
        record["status"], record["message"] = "error", str(exc)
        record["traceback"] = exc.__cause__ and "".join(traceback.format_exception(exc.__cause__))
    return record


def _entry(dump: Dump, full: str, direction: str) -> dict[str, Any]:
    entry = dump.entry(f"{full}.{direction}")
    if entry is None:
        raise NotCheckable(f"no {direction} entry {full}.{direction} in the dump")
    if not isinstance(entry, dict):
        raise NotCheckable(f"entry {full}.{direction} is a {type(entry).__name__}, expected an object")
    return entry


def _run(dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any], record: dict[str, Any]) -> None:
    api = name.api_name
    if dump.framework != "pytorch":
        raise NotCheckable(f"{dump.framework} dumps are collected but not executed yet (framework {dump.framework!r})")
    for group in ("always_skip", "random_apis"):
        if in_list(specs, api, group):
            raise NotCheckable(f"{name.full_name}: {specs[group]['reason']}")
    forward = _entry(dump, name.full_name, "forward")
    backward_entry = _entry(dump, name.full_name, "backward") if name.direction == "backward" else None
    want_grad = backward_entry is not None
    kwargs_enc = forward.get("input_kwargs") or {}
    args_enc = forward.get("input_args") or []
    if not isinstance(args_enc, list) or not isinstance(kwargs_enc, dict):
        raise NotCheckable(f"{name.full_name}: input_args must be a list and input_kwargs an object")
    if want_grad:
        if in_list(specs, api, "backward", "not_backward"):
            raise NotCheckable(f"{api}: no backward input data is recorded for this API")
        if in_list(specs, api, "backward", "unsupported"):
            raise NotCheckable(f"{api}: backward of this API is not checkable")
        if "out" in kwargs_enc:
            raise NotCheckable(f"{api}: called with out=..., which does not support autograd")

    device = select_device(options.device, options.device_index)
    resolved = resolve(name.api_type, api, device, specs)
    record["device"] = device.name
    record["impl"] = resolved.label
    if resolved.reference_vs_reference:
        record["notes"].append("reference-vs-reference: the device side runs the bench function in the recorded "
                               "dtype, not a vendor kernel")

    started = time.perf_counter()
    real = options.data_mode == "real" or (options.data_mode == "auto" and dump.is_real_data)
    ctx = BuildContext(dump, torch.Generator().manual_seed(record["seed"]), real,
                       options.max_tensor_bytes or int(specs.get("max_tensor_bytes", 4 << 30)))
    args = []
    for i, enc in enumerate(args_enc):
        ctx.clamp_min_zero = i == 1 and in_list(specs, api, "preprocess", "clamp_min_zero_arg1")
        args.append(build(enc, ctx, f"input_args.{i}"))
    ctx.clamp_min_zero = False
    kwargs = {k: build(v, ctx, f"input_kwargs.{k}", kwarg=k) for k, v in kwargs_enc.items()}
    args, kwargs = _preprocess(api, args, kwargs, specs, ctx.requires_grad)
    cotangents: list[Any] = []
    if backward_entry is not None:
        grad_ctx = BuildContext(dump, torch.Generator().manual_seed(record["seed"] + 1), real, ctx.max_bytes)
        raw = backward_entry.get("input")
        cotangents = [build(c, grad_ctx, f"backward.input.{i}") for i, c in enumerate(raw if isinstance(raw, list) else [raw])]
        cotangents = output_leaves(cotangents)
    record["notes"] += ctx.notes
    record["data"] = "real" if ctx.loaded_files else "random"

    plan = plan_precision(api, args, kwargs, first_output_dtype(forward.get("output")), specs)
    if plan.hf32:
        args = [hf32_round(a) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args]

    def bench_dtype(t: torch.Tensor) -> torch.dtype:
        if plan.raise_to is None or t.dtype not in RAISABLE or (plan.hf32 and t.dtype == torch.float32):
            return t.dtype
        return plan.raise_to

    dev_side = make_side(args, kwargs, device=device.name, dtype_for=lambda t: t.dtype,
                         requires_grad=ctx.requires_grad, want_grad=want_grad, bench=False)
    bench_side = make_side(args, kwargs, device="cpu", dtype_for=bench_dtype,
                           requires_grad=ctx.requires_grad, want_grad=want_grad, bench=True)
    record["timings"]["inputs_s"] = time.perf_counter() - started

    timings = record["timings"]
    torch.manual_seed(record["seed"])  # random APIs inside the call (dropout) replay identically per item
    out_d = _timed(timings, "device_s", "device", lambda: run_side(
        resolved.device_fn, dev_side, autocast=plan.autocast, device_type=device.kind, grad=want_grad), device)
    out_b = _timed(timings, "bench_s", "bench", lambda: run_side(
        resolved.bench_fn, bench_side, autocast=None, device_type="cpu", grad=want_grad), None)
    leaves_d, leaves_b = output_leaves(out_d), output_leaves(out_b)
    selected = specs.get("forward_output_index", {}).get(api)
    if selected is not None:
        leaves_d = [leaves_d[i] for i in selected if i < len(leaves_d)]
        leaves_b = [leaves_b[i] for i in selected if i < len(leaves_b)]

    started = time.perf_counter()
    if backward_entry is None:
        _compare(record, f"{name.full_name}.forward.output", leaves_b, leaves_d, api, specs)
    else:
        if not dev_side.grad_leaves:
            raise NotCheckable(f"{name.full_name}: no floating-point input is recorded with requires_grad=true")
        grad_index = specs.get("backward", {}).get("grad_index", {}).get(api)
        pairs_b = pair_cotangents(leaves_b, cotangents, grad_index)
        pairs_d = pair_cotangents(leaves_d, cotangents, grad_index)
        if not pairs_b or len(pairs_b) != len(pairs_d):
            raise NotCheckable(f"{name.full_name}: no differentiable output pairs with a recorded gradient")
        _timed(timings, "bench_backward_s", "bench backward", lambda: backward(leaves_b, pairs_b, "cpu"), None)
        _timed(timings, "device_backward_s", "device backward",
               lambda: backward(leaves_d, pairs_d, device.name), device)
        grads_b = [leaf.grad for _, leaf in bench_side.grad_leaves]
        grads_d = [leaf.grad for _, leaf in dev_side.grad_leaves]
        positions = [pos for pos, _ in dev_side.grad_leaves]
        _compare(record, f"{name.full_name}.backward.output", grads_b, grads_d, api, specs, positions)
    timings["compare_s"] = time.perf_counter() - started
    record["status"] = standards.aggregate(row["status"] for row in record["outputs"])
    if record["status"] == "SKIP" and not record["message"]:
        record["message"] = "; ".join(row["message"] for row in record["outputs"] if row["message"]) or \
            "nothing was compared"


def _timed(timings: dict[str, float], key: str, what: str, fn: Any, device: Device | None) -> Any:
    started = time.perf_counter()
    try:
        result = fn()
        if device is not None:
            device.synchronize()
    except (NotCheckable, InputError):
        raise
    except Exception as exc:
        if type(exc).__name__ == "BenchUnsupported":  # bench_functions' own "cannot reproduce this call"
            raise NotCheckable(str(exc)) from None
        raise ApiFailure(f"{what} run raised {type(exc).__name__}: {exc}") from exc
    finally:
        timings[key] = time.perf_counter() - started
    return result


def _preprocess(api: str, args: list[Any], kwargs: dict[str, Any], specs: dict[str, Any],
                requires_grad: set[int]) -> tuple[list[Any], dict[str, Any]]:
    """msprobe's dtype conversions for CPU kernels (int32 targets -> int64, int histc input -> fp32)."""
    conversions = []
    for rule in specs.get("convert", {}).values():
        if api in rule.get("apis", []):
            conversions.append((parse_dtype(rule["from"]), parse_dtype(rule["to"])))
    if not conversions:
        return args, kwargs

    def convert(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            for src, dst in conversions:
                if v.dtype == src:
                    new = v.to(dst)
                    if id(v) in requires_grad:
                        requires_grad.add(id(new))
                    return new
        return v

    return [convert(a) for a in args], {k: convert(v) for k, v in kwargs.items()}


def _to_numpy(x: Any) -> tuple[str, Any, str | None]:
    if x is None:
        return ("none", None, None)
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().resolve_conj()
        dtype = str(t.dtype)
        if t.dtype in _LOW_PRECISION:
            t = t.float()
        return ("tensor", t.numpy(), dtype)
    return ("scalar", x, None)


def _compare(record: dict[str, Any], prefix: str, bench: list[Any], device: list[Any], api: str,
             specs: dict[str, Any], positions: list[int] | None = None) -> None:
    if api in specs.get("dropout_apis", []):
        b = next((x for x in bench if isinstance(x, torch.Tensor)), None)
        d = next((x for x in device if isinstance(x, torch.Tensor)), None)
        if b is None or d is None:
            raise NotCheckable(f"{api}: dropout produced no tensor to judge")
        status, message = standards.dropout_verdict(_to_numpy(b)[1], _to_numpy(d)[1], specs)
        record["outputs"].append({
            "name": f"{prefix}.0", "status": status, "message": message, "bench_dtype": str(b.dtype),
            "device_dtype": str(d.dtype), "shape": list(d.shape), "metrics": {}, "worst": None,
        })
        record["notes"].append("dropout: judged by the fraction of zeros (msprobe's rule), not by values")
        return
    rows = standards.compare_structure(prefix, bench, device, api_name=api, specs=specs, converter=_to_numpy)
    for i, row in enumerate(rows):
        data = row.to_dict()
        if positions is not None and i < len(positions):
            data["name"] = f"{prefix}.{positions[i]}"
        record["outputs"].append(data)
