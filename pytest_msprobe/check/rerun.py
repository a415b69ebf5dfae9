"""One item's whole check: rebuild inputs, run device and bench, compare, produce a record.

The record is a plain JSON-able dict so it can travel from an xdist worker to the controller
on the test report; `report.py` turns records into msprobe's CSV files.
"""
from __future__ import annotations

import functools
import time
import traceback
from concurrent.futures import Future, wait
from typing import Any, Callable

import torch

from ..dump.reader import Dump, parse_entry_name
from ..helper import helper
from ..inputs.build import InputError
from ..inputs.seeds import item_seed
from ..runs import backends, capture, kernels
from ..runs.backends import not_implemented
from ..runs.backends import select as select_device
from ..runs.execution import (
    HF32_BITS,
    RAISABLE,
    TF32_BITS,
    Device,
    NotCheckable,
    Shared,
    Side,
    backward,
    broken_precondition,
    first_output_dtype,
    first_output_shape,
    input_rounding,
    make_side,
    map_structure,
    output_leaves,
    pair_cotangents,
    plan_precision,
    resolve,
    round_mantissa,
    run_side,
    seed_random_apis,
    tensors_of,
)
from ..runs.sharing import may_grow, written_inputs
from ..runs.third_run import ReferenceRun, autocast_round, bench_product, summed_outputs, summed_run, third_run
from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list
from ..verdict import contracts, standards
from .compare import EarlyMetrics, compare_outputs, start_metrics
from .prepare import (
    build_pending_here,
    checkable_entries,
    contract_terms,
    encoded_arguments,
    prepared_inputs,
    start_prefetch,
)
from .unique import judge_by_validity


class ApiFailure(Exception):
    """The API raised while running; the record keeps the traceback. `side`: "device" for the device's forward or
    backward, else the run that raised."""

    def __init__(self, message: str, side: str = "") -> None:
        super().__init__(message)
        self.side = side


Runner = Callable[[Dump, Any, CheckOptions, dict[str, Any], dict[str, Any]], None]


def check_entry(dump: Dump, entry_name: str, options: CheckOptions, specs: dict[str, Any], *, overflow: Runner,
                external: Runner) -> dict[str, Any]:
    """One entry's record. The other flows come in as callables (check/__init__.py passes them), so
    they can reuse this module's steps without an import cycle: `overflow` for overflow_check dumps,
    `external` for replay mode and MindSpore dumps."""
    name = parse_entry_name(entry_name)
    overflowing = dump.task == "overflow_check"  # REFERENCE §3.6: classify each overflow instead of judging precision
    # the inputs the call may not write are shared by the sides (_run says which); if the call wrote into one
    # after all, the item is judged on fresh inputs again, with a copy of every input per side. A loop, not a
    # helper function: a frame more would make a dump nested near Python's recursion limit fail in the worker
    note = ""
    for shared in (None,) if overflowing else (Shared(None), None):
        record: dict[str, Any] = {
            "api": name.full_name, "direction": name.direction, "status": "SKIP", "message": "",
            "seed": item_seed(options.run_seed, name.full_name), "device": "", "impl": "", "notes": [],
            "outputs": [], "timings": {},
        }
        run: Runner = overflow if overflowing else functools.partial(_run, external=external, shared=shared)
        if overflowing:
            record["mode"] = "overflow_check"
        try:
            run(dump, name, options, specs, record)
        except (NotCheckable, InputError) as exc:
            record["status"], record["message"] = "SKIP", str(exc)
        except (ApiFailure, kernels.KernelError) as exc:
            record["status"], record["message"] = "error", str(exc)
            record["traceback"] = exc.__cause__ and "".join(traceback.format_exception(exc.__cause__))
            if isinstance(exc, ApiFailure) and exc.side == "device" and not_implemented(exc.__cause__):
                # a device without a kernel for this call (or dtype) says nothing about its accuracy: counted apart
                record["status"], record["not_implemented"] = "SKIP", True
                record["message"] = f"not implemented on the device: {exc}"
        except Exception:
            if shared is None or not shared.changed():
                raise
        written = shared.changed() if shared is not None else []
        if not written:
            break
        note = (f"the call wrote into {len(written)} input(s) that another side read (torch's version counter "
                "moved): checked again with a copy of every input per side")
    if note:
        record["notes"].append(note)
    return record


def _run(dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any], record: dict[str, Any], *,
         external: Runner, shared: Shared | None) -> None:
    api = name.api_name
    user, forward, backward_entry = checkable_entries(dump, name, specs)
    want_grad = backward_entry is not None
    args_enc, kwargs_enc = encoded_arguments(forward, name.full_name)
    if want_grad:
        if in_list(specs, api, "backward", "not_backward"):
            raise NotCheckable(f"{api}: no backward input data is recorded for this API")
        if in_list(specs, api, "backward", "unsupported"):
            raise NotCheckable(f"{api}: backward of this API is not checkable")
        if "out" in kwargs_enc:
            raise NotCheckable(f"{api}: called with out=..., which does not support autograd")
    if options.mode == "replay" or dump.framework != "pytorch":  # recorded outputs, MindSpore (replay.py)
        return external(dump, name, options, specs, record)

    device = select_device(options.device, options.device_index)
    resolved = resolve(name.api_type, api, device, specs, forward)
    resolved = kernels.substitute(options.kernels, name.api_type, api, resolved)  # --msprobe-kernels
    record["device"] = device.name
    record["backend"] = device.label
    contract = record["contract"] = contracts.resolve(options.contract, device.kind)
    record["impl"] = resolved.label
    if resolved.kernel:
        record["kernel"] = resolved.kernel
    if resolved.reference_vs_reference:
        record["reference_only"] = True  # counted apart: such a pass says nothing about a vendor kernel
        record["notes"].append("reference-vs-reference: the device side runs the bench function in the recorded "
                               "dtype, not a vendor kernel")

    started = time.perf_counter()
    ctx, args, kwargs, cotangents = prepared_inputs(dump, api, args_enc, kwargs_enc, backward_entry, record, options,
                                                    specs)
    plan = plan_precision(api, args, kwargs, first_output_dtype(forward.get("output")), specs, options.bench_precision,
                          options.standard)
    rounding = input_rounding(api, plan.hf32, device, specs)
    if rounding == "HF32":  # msprobe's rule: the positional fp32 inputs of Ascend's HF32 convolutions
        args = [_round_input(a, ctx.requires_grad) for a in args]
    elif rounding == "TF32":  # every fp32 input the kernel reads, and the gradients its backward reads

        def tf32(value: Any) -> Any:
            return _round_input(value, ctx.requires_grad, TF32_BITS)

        args, kwargs = [map_structure(tf32, a) for a in args], {k: map_structure(tf32, v) for k, v in kwargs.items()}
        cotangents = [tf32(c) for c in cotangents]
        record["notes"].append(f"TF32: {device.kind} reads {TF32_BITS} mantissa bits of this API's fp32 inputs "
                               "(torch's setting), so they are rounded to TF32 on both sides")
    capture.stash(args=args, kwargs=kwargs, requires_grad=ctx.requires_grad, cotangents=cotangents, plan=plan,
                  device=device, name=name, want_grad=want_grad,
                  resolved=resolved)  # --msprobe-save-error-data/-repro/-fuzz

    def bench_dtype(t: torch.Tensor) -> torch.dtype:
        if plan.raise_to is None or t.dtype not in RAISABLE or (plan.hf32 and t.dtype == torch.float32):
            return t.dtype
        return plan.raise_to

    # With a spare core the bench (forward and backward) runs beside the device and the third run, unless the
    # call may draw random numbers (device and third run draw the same ones from the one CPU generator) or is
    # an NPU op (its outputs are post-processed before its backward).
    beside = options.work_threads > 1 and name.api_type != "NPU" and not may_draw(api, kwargs, specs)
    if shared is not None:  # the sides on the CPU take the inputs the call cannot write without a copy
        shared.written = written_inputs(name.api_type, api, resolved.bench_fn, args, kwargs, specs)
        # the inputs are read after the runs; a drawn tensor's storage cannot grow; a bench beside the device
        # makes its side in the helper thread, and reads there every input as it was drawn
        shared.give = not beside and not capture.active() and name.api_type != "NPU" and \
            not may_grow(api, args, kwargs, shared.written, forward.get("output"))
    plain = device.backend is None or type(device.backend).to_device is backends.Backend.to_device
    dev_side = make_side(args, kwargs, device=device.name, dtype_for=lambda t: t.dtype,
                         requires_grad=ctx.requires_grad, want_grad=want_grad, bench=False,
                         move=None if plain else device.to_device,
                         shared=None if resolved.kernel else shared)  # a kernel may write behind torch's back
    bench_args, bench_kwargs = args, kwargs
    if options.standard == "strict" and error_kind(api, specs) == "contraction" and \
            not any(t.dtype == torch.float64 for t in tensors_of(args)):
        # a kernel computing in fp32 or below takes its alpha and beta as fp32: so does the bench
        scalars = specs["error_model"].get("contraction_scalars", ())
        bench_kwargs = {k: float(torch.tensor(v, dtype=torch.float32)) if k in scalars and type(v) is float else v
                        for k, v in kwargs.items()}
    asked = bench_kwargs.get("dtype")
    if plan.raise_to is not None and asked in RAISABLE and asked.itemsize < plan.raise_to.itemsize:
        # the result dtype the call asks for is raised with its inputs (a narrower one makes the raised
        # bench refuse: vector_norm(x, dtype=torch.bfloat16) with x raised to fp32)
        bench_kwargs = {**bench_kwargs, "dtype": plan.raise_to}
    autocast = plan.autocast
    if autocast is not None and options.standard == "strict" and \
            in_list(specs, api, "error_model", "autocast_lower_precision"):
        # the autocast kernel computes from its inputs rounded to the autocast dtype: so does the bench
        bench_args, bench_kwargs = (map_structure(lambda v: autocast_round(v, autocast, ctx.requires_grad), x)
                                    for x in (bench_args, bench_kwargs))
        record["notes"].append(f"autocast: the bench's inputs are rounded to {plan.autocast}, as the kernel's were")
    timings = record["timings"]
    made: list[Side] = []

    def bench_side() -> Side:
        """The bench's side, made on first use: in the helper thread when the bench runs there, which takes its
        casts to fp32 and fp64 (an item's largest copies) off the items' thread. No side holds a written input
        as drawn then (`shared.give`), so that the helper may read every input while the device runs."""
        if not made:
            began = time.perf_counter()
            made.append(make_side(bench_args, bench_kwargs, device="cpu", dtype_for=bench_dtype,
                                  requires_grad=ctx.requires_grad, want_grad=want_grad, bench=True, shared=shared))
            if beside:
                timings["inputs_beside_s"] = time.perf_counter() - began
        return made[0]

    if not beside:
        bench_side()
    timings["inputs_s"] = time.perf_counter() - started

    reference = third_run(options, resolved, name, specs, plan, args, kwargs, ctx.requires_grad, want_grad,
                          shared=shared)
    summed = summed_run(options, resolved, api, specs, args, kwargs, ctx.requires_grad, want_grad,
                        first_output_shape(forward.get("output")), shared=shared)
    summed = summed or contract_terms(options, contract, api, specs, args, kwargs, ctx.requires_grad, want_grad,
                                      shared)
    api_key, entry_name = f"{name.api_type}.{api}", f"{name.full_name}.{name.direction}"
    # The device call, and only it, runs inside the boundary (backends.device_call) that plugins wrap.
    device_fn = backends.runner(device, api_key, resolved.device_fn)
    grad_index = user.get("grad_index", specs.get("backward", {}).get("grad_index", {}).get(api))

    def run_bench() -> Any:
        return run_side(resolved.bench_fn, bench_side(), autocast=None, device_type="cpu", grad=want_grad)

    threads = torch.get_num_threads()  # this thread's: CPU reductions (the bench's) split by it, so the helper's too

    def bench_runs(with_backward: bool) -> tuple[Any, list[Any], int]:
        """The bench's forward and, `with_backward`, its backward (beside the device: in the helper thread);
        its outputs, and how many of them took a gradient."""
        same_threads(threads)
        bench_side()  # not timed as the bench's run
        out = _timed(timings, "bench_s", "bench", run_bench, None)
        leaves = _selected(output_leaves(out), api, specs)
        return out, leaves, bench_backward(name, leaves, cotangents, grad_index, timings) if with_backward else 0

    def reference_runs(run: ReferenceRun | None = reference, key: str = "reference") -> list[Any] | None:
        """The third run's (or `run`'s) forward and, for a backward item, its backward; its outputs (None without
        one)."""
        if run is None or run.side is None:
            return None
        ref_side = run.side
        same_threads(threads)
        seed_random_apis(record["seed"], run.device)  # the same random numbers as the device call
        out_r = _timed(timings, f"{key}_s", key, lambda: run_side(
            run.fn, ref_side, autocast=run.autocast, device_type=run.device.kind, grad=want_grad), run.device)
        leaves_r = _selected(output_leaves(out_r), api, specs)
        if backward_entry is not None:
            pairs_r = pair_cotangents(leaves_r, [run.cotangent(c) for c in cotangents], grad_index)
            _timed(timings, f"{key}_backward_s", f"{key} backward",
                   lambda: backward(leaves_r, pairs_r, run.device.name), run.device)
        return leaves_r

    # A CPU third run is queued behind the bench: the items' thread takes it back if the helper has not started
    # it by the time the device is done, so whichever thread is free first runs it.
    bench_future = helper().submit(bench_runs, want_grad) if beside else None
    ref_future = helper().submit(reference_runs) if beside and reference is not None and \
        reference.side is not None and reference.device.kind == "cpu" else None
    helped: list[Future[Any]] = [f for f in (bench_future, ref_future) if f is not None]
    if bench_future is None:
        start_prefetch()  # the next item's inputs, in the helper thread while the API runs
    seed_random_apis(record["seed"], device)  # random APIs inside the call (dropout) replay identically per item
    try:
        try:
            out_d = _timed(timings, "device_s", "device", lambda: backends.device_call(
                entry_name, api_key, "forward", device, resolved.label, lambda: run_side(
                    device_fn, dev_side, autocast=plan.autocast, device_type=device.kind, grad=want_grad)), None)
        except ApiFailure as failure:
            reason = record["data"] == "random" and broken_precondition(
                failure.__cause__, functools.partial(_bench_raw, bench_future) if bench_future else run_bench,
                resolved.bench_fn, bench_side)
            if reason:
                raise NotCheckable(reason) from None
            raise
        leaves_d = _selected(output_leaves(out_d), api, specs)
        out_b: Any = None
        leaves_b: list[Any] = []
        early = None
        pairs_b = pairs_d = 0
        if bench_future is None:
            out_b, leaves_b, _ = bench_runs(False)
            if name.api_type == "NPU":  # rows an NPU op leaves unwritten (output_postprocess, bench_functions.yaml)
                from bench_functions import postprocess
                leaves_d, leaves_b = (postprocess(api, leaves, args, kwargs, side)
                                      for leaves, side in ((leaves_d, "device"), (leaves_b, "bench")))
            # msprobe's metrics need only bench and device: with a spare core they run while the torch run does
            early = start_metrics(f"{name.full_name}.forward.output", leaves_b, leaves_d, api, specs, options) \
                if backward_entry is None else None
        leaves_r: list[Any] | None = None  # the third run's outputs
        try:
            if backward_entry is not None:
                if not dev_side.grad_leaves:
                    raise NotCheckable(f"{name.full_name}: no floating-point input is recorded with requires_grad=true")
                if bench_future is None:
                    pairs_b = bench_backward(name, leaves_b, cotangents, grad_index, timings)
                pairs_d = device_backward(name, leaves_d, cotangents, grad_index, timings, device, resolved.label)
            if bench_future is not None:
                # msprobe's metrics, queued behind the bench (they need only its outputs and the device's): the
                # helper goes on to them while this thread runs the third run; then the next item's inputs
                early = queued_metrics(name, bench_future, bench_side, dev_side, leaves_d, backward_entry is not None,
                                       api, specs, options)
                helped += [early.rows] if early is not None else []  # after the runs: not a run's failure
                start_prefetch()
            if ref_future is None or ref_future.cancel():  # not started in the helper yet: run here
                leaves_r = reference_runs()
            else:
                leaves_r = ref_future.result()
            if leaves_r is not None and reference is not None:
                record["reference"] = reference.label
            summed_out = summed_outputs(summed, reference_runs(summed.run, "magnitude") if summed else None,
                                        backward_entry is not None)
        except Exception:
            # the runs beside this thread (not the metrics queued behind them): one thread meets the bench's
            # failure first, so is it reported
            for first in (f for f in (bench_future, ref_future) if f is not None):
                failed = None if first.cancelled() else first.exception()
                if failed is not None:
                    raise failed from None
            raise
        if bench_future is not None:
            waited = time.perf_counter()
            if not bench_future.done():
                build_pending_here()  # the next item's inputs, queued behind the bench: built here while it runs
            out_b, leaves_b, pairs_b = bench_future.result()
            timings["bench_wait_s"] = time.perf_counter() - waited  # the items' thread's part of a bench beside it
        capture.stash(out_d=out_d, out_b=out_b)
        if pairs_b != pairs_d:
            raise NotCheckable(f"{name.full_name}: no differentiable output pairs with a recorded gradient")

        started = time.perf_counter()
        role = reference.role if reference is not None else "torch"
        if backward_entry is None:
            product = bench_product(api, bench_side(), leaves_b, specs) if role == "magnitude" else None
            compare_outputs(record, f"{name.full_name}.forward.output", leaves_b, leaves_d, leaves_r, role, api,
                            specs, options, product=product, autocast=plan.autocast,
                            scalar_operand=has_scalar_operand(args, kwargs), early=early, contract=contract,
                            summed=summed_out)
            judge_by_validity(record, api, specs, options.standard, leaves_b, leaves_d, dev_side.args, dev_side.kwargs)
        else:
            grads_b = [leaf.grad for _, leaf in bench_side().grad_leaves]
            grads_d = [leaf.grad for _, leaf in dev_side.grad_leaves]
            positions = [pos for pos, _ in dev_side.grad_leaves]
            prefix = f"{name.full_name}.backward.output"
            early = early if bench_future is not None else start_metrics(prefix, grads_b, grads_d, api, specs, options)
            grads_r = estimated = None
            if reference is not None and reference.side is not None and leaves_r is not None:
                grads_r, estimated = reference.complete([leaf.grad for _, leaf in reference.side.grad_leaves],
                                                        grads_b, [pos for pos, _ in reference.side.grad_leaves])
            compare_outputs(record, prefix, grads_b, grads_d, grads_r, role, api, specs, options,
                            positions, autocast=plan.autocast, gradients=True, estimated=estimated, early=early,
                            contract=contract, summed=summed_out)
        timings["compare_s"] = time.perf_counter() - started
        finish_record(record)
    except BaseException as exc:
        for future in helped:
            future.cancel()
        if isinstance(exc, Exception):  # the record is final only once the runs beside it are done; a timeout
            wait(helped)  # (a BaseException) gets a record of its own and leaves the helper to finish
        raise


def queued_metrics(name: Any, bench_future: Future[Any], bench_side: Callable[[], Side], dev_side: Side,
                   leaves_d: list[Any], gradients: bool, api: str, specs: dict[str, Any],
                   options: CheckOptions) -> EarlyMetrics | None:
    """start_metrics of a bench running in the helper thread: its outputs (a backward item's: its gradients)
    are taken there once it is done, ahead in the queue."""
    if gradients:
        def bench() -> list[Any]:
            bench_future.result()
            return [leaf.grad for _, leaf in bench_side().grad_leaves]

        return start_metrics(f"{name.full_name}.backward.output", bench, [leaf.grad for _, leaf in dev_side.grad_leaves],
                             api, specs, options)
    return start_metrics(f"{name.full_name}.forward.output", lambda: bench_future.result()[1], leaves_d, api, specs,
                         options)


def same_threads(threads: int) -> None:
    """torch's intra-op threads of this thread set to the items' thread's: a thread torch has not seen starts
    from the machine's default (OMP_NUM_THREADS, else every core), and kernels that size their partial sums by
    it (layer_norm's weight gradient) would round otherwise than on the items' thread."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _bench_raw(future: Future[Any]) -> Any:
    """The bench's result, or its own exception (not the ApiFailure around it), as run_bench would raise it."""
    try:
        return future.result()
    except ApiFailure as failure:
        raise (failure.__cause__ or failure) from None


def backward_seconds(timings: dict[str, float]) -> float:
    """The backward passes' time so far: `compare_s` is the checks alone, the backward passes have their keys."""
    return sum(v for k, v in timings.items() if k.endswith("backward_s"))


def may_draw(api: str, kwargs: dict[str, Any], specs: dict[str, Any]) -> bool:
    """Whether a call may draw from torch's CPU generator: a random or dropout API, or a dropout-like argument."""
    return api in specs.get("dropout_apis", []) or in_list(specs, api, "random_apis") or \
        any("dropout" in key or key in ("p", "keep_prob", "generator", "training") for key in kwargs)


def bench_backward(name: Any, leaves_b: list[Any], cotangents: list[Any], grad_index: int | None,
                   timings: dict[str, float]) -> int:
    """The bench's backward from the recorded gradients paired with its outputs; how many were paired."""
    pairs_b = pair_cotangents(leaves_b, cotangents, grad_index)
    if not pairs_b:
        raise NotCheckable(f"{name.full_name}: no differentiable output pairs with a recorded gradient")
    _timed(timings, "bench_backward_s", "bench backward", lambda: backward(leaves_b, pairs_b, "cpu"), None)
    return len(pairs_b)


def device_backward(name: Any, leaves_d: list[Any], cotangents: list[Any], grad_index: int | None,
                    timings: dict[str, float], device: Device, impl: str) -> int:
    """The device's backward, inside the device-call boundary; how many outputs were paired."""
    pairs_d = pair_cotangents(leaves_d, cotangents, grad_index)
    if not pairs_d:
        raise NotCheckable(f"{name.full_name}: no differentiable output pairs with a recorded gradient")
    _timed(timings, "device_backward_s", "device backward", lambda: backends.device_call(
        f"{name.full_name}.{name.direction}", f"{name.api_type}.{name.api_name}", "backward", device, impl,
        lambda: backward(leaves_d, pairs_d, device.name)), None)
    return len(pairs_d)


def backward_both(name: Any, leaves_b: list[Any], leaves_d: list[Any], cotangents: list[Any], grad_index: int | None,
                  timings: dict[str, float], device: Device, impl: str) -> None:
    """Backward of the bench and of the device (overflow_check dumps)."""
    if bench_backward(name, leaves_b, cotangents, grad_index, timings) != \
            device_backward(name, leaves_d, cotangents, grad_index, timings, device, impl):
        raise NotCheckable(f"{name.full_name}: no differentiable output pairs with a recorded gradient")


def finish_record(record: dict[str, Any]) -> None:
    """The item's statuses from its output rows: Layer 1 alone, and with the standard's verdicts."""
    record["layer1_status"] = standards.aggregate(row["status"] for row in record["outputs"])
    record["status"] = standards.aggregate(row["verdict"] or row["status"] for row in record["outputs"])
    if record["status"] == "SKIP" and not record["message"]:
        record["message"] = "; ".join(row.get("verdict_message") or row["message"] for row in record["outputs"]
                                      if row.get("verdict_message") or row["message"]) or \
            "nothing was compared"


def _selected(leaves: list[Any], api: str, specs: dict[str, Any]) -> list[Any]:
    """Only the outputs api_specs says are comparable (e.g. attention_out of npu_fusion_attention)."""
    selected = specs.get("forward_output_index", {}).get(api)
    return leaves if selected is None else [leaves[i] for i in selected if i < len(leaves)]


def _round_input(value: Any, requires_grad: set[int], bits: int = HF32_BITS) -> Any:
    """An fp32 tensor rounded to HF32 (or `bits` mantissa bits), keeping its place among the inputs that
    require a gradient."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        return value
    rounded = round_mantissa(value, bits)
    if id(value) in requires_grad:
        requires_grad.add(id(rounded))
    return rounded


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
        raise ApiFailure(f"{what} run raised {type(exc).__name__}: {exc}",
                         "device" if what.startswith("device") else what) from exc
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - started  # the twins share a key
    return result


def has_scalar_operand(args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a Python number is among a call's arguments (which a kernel may round otherwise than torch)."""
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (*args, *kwargs.values()))
