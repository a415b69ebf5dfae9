"""One item's whole check: rebuild inputs, run device and bench, compare, produce a record.

`_run` is a pipeline of named stages, each one call: the entries; where each side runs (placement.py); the
inputs, with what precision each side computes in and what rounding the inputs get (precision.py); the
sides; which runs exist and running them (execute.py); how outputs are compared (`compare_item`, through
compare.py). Replay and MindSpore items (replay.py) take the same stages where they apply; they differ in
where the device result comes from.

The record is a plain JSON-able dict so it can travel from an xdist worker to the controller
on the test report; `report.py` turns records into msprobe's CSV files.
"""
from __future__ import annotations

import functools
import time
import traceback
from typing import Any, Callable

from ..dump.reader import Dump, parse_entry_name
from ..inputs.build import InputError
from ..inputs.seeds import item_seed
from ..runs import capture, kernels
from ..runs.backends import not_implemented
from ..runs.execution import NotCheckable, Shared
from ..runs.third_run import ReferenceRun, bench_product
from ..settings import CheckOptions
from ..specs.loader import in_list
from . import chunked, execute, placement, precision
from .calls import ApiFailure, finish_record, has_scalar_operand
from .compare import compare_outputs, start_metrics
from .execute import Item, Outputs, Sides
from .placement import Placement, may_draw
from .precision import Inputs
from .prepare import checkable_entries, encoded_arguments, prepared_inputs
from .unique import judge_by_validity

__all__ = ["ApiFailure", "check_entry", "may_draw"]


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
    """The stages of a re-run item, each one call; recorded outputs and MindSpore dumps go to `external`."""
    item, args_enc, kwargs_enc = entries(dump, name, options, specs, record)
    if options.mode == "replay" or dump.framework != "pytorch":  # recorded outputs, MindSpore (replay.py)
        return external(dump, name, options, specs, record)
    where = placement.place(name, options, specs, item.forward, record)
    started = time.perf_counter()
    ctx, args, kwargs, cotangents = prepared_inputs(dump, name.api_name, args_enc, kwargs_enc, item.backward_entry,
                                                    record, options, specs)
    inputs = Inputs(args, kwargs, cotangents, ctx.requires_grad)
    plan = precision.plan(name.api_name, inputs, item.forward, specs, options)
    inputs = precision.round_inputs(name.api_name, inputs, plan.hf32, where.device, specs, record["notes"])
    where = placement.place_bench(where, options, plan, inputs, record)
    if chunked.in_pieces(item, where, plan, inputs, shared):  # too large to check whole: a block of rows at a time
        return
    capture.stash(args=inputs.args, kwargs=inputs.kwargs, requires_grad=inputs.requires_grad,
                  cotangents=inputs.cotangents, plan=plan, device=where.device, name=name, want_grad=item.want_grad,
                  resolved=where.resolved)  # --msprobe-save-error-data/-repro/-fuzz
    sides = make_sides(item, where, plan, inputs, shared)
    record["timings"]["inputs_s"] = time.perf_counter() - started
    runs = execute.Runs(item, where, plan, inputs, sides, *execute.third_runs(item, where, plan, inputs, shared))
    with runs.guarded():
        outputs = runs.run()
        started = time.perf_counter()
        compare_item(item, where, plan, inputs, sides, runs.reference, outputs)
        record["timings"]["compare_s"] = time.perf_counter() - started
        finish_record(record)


def entries(dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any],
            record: dict[str, Any]) -> tuple[Item, list[Any], dict[str, Any]]:
    """The entries the item checks and its encoded arguments; NotCheckable where its backward cannot be."""
    api = name.api_name
    user, forward, backward_entry = checkable_entries(dump, name, specs)
    args_enc, kwargs_enc = encoded_arguments(forward, name.full_name)
    if backward_entry is not None:
        if in_list(specs, api, "backward", "not_backward"):
            raise NotCheckable(f"{api}: no backward input data is recorded for this API")
        if in_list(specs, api, "backward", "unsupported"):
            raise NotCheckable(f"{api}: backward of this API is not checkable")
        if "out" in kwargs_enc:
            raise NotCheckable(f"{api}: called with out=..., which does not support autograd")
    return Item(name, options, specs, record, user, forward, backward_entry), args_enc, kwargs_enc


def make_sides(item: Item, where: Placement, plan: Any, inputs: Inputs, shared: Shared | None) -> Sides:
    """The device's side, and the bench's (made here unless it runs beside the device): who shares what."""
    name, options, specs = item.name, item.options, item.specs
    beside = placement.bench_beside(name, inputs.kwargs, options, specs)
    placement.share(shared, name, where.resolved, inputs, beside, item.forward, specs)
    device_side = placement.device_side(inputs, where, item.want_grad, shared)
    bench_args, bench_kwargs = precision.bench_arguments(name.api_name, inputs, plan, options, specs,
                                                         item.record["notes"])
    bench_side = placement.BenchSide(bench_args, bench_kwargs, precision.bench_dtype(plan), inputs.requires_grad,
                                     item.want_grad, shared, beside, item.record["timings"], where.bench)
    if not beside:
        bench_side()
    return Sides(device_side, bench_side, beside)


def compare_item(item: Item, where: Placement, plan: Any, inputs: Inputs, sides: Sides,
                 reference: ReferenceRun | None, out: Outputs) -> None:
    """How the outputs are compared: a forward item's outputs, or a backward item's gradients, each pair with
    the bench's and the third run's (compare.compare_outputs)."""
    record, options, specs, api, full = item.record, item.options, item.specs, item.name.api_name, item.name.full_name
    role = reference.role if reference is not None else "torch"
    if item.backward_entry is None:
        product = bench_product(api, sides.bench(), out.leaves_b, specs) if role == "magnitude" else None
        compare_outputs(record, f"{full}.forward.output", out.leaves_b, out.leaves_d, out.leaves_r, role, api,
                        specs, options, product=product, autocast=plan.autocast,
                        scalar_operand=has_scalar_operand(inputs.args, inputs.kwargs), early=out.early,
                        contract=where.contract, summed=out.summed)
        judge_by_validity(record, api, specs, options.standard, out.leaves_b, out.leaves_d, sides.device.args,
                          sides.device.kwargs)
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
    compare_outputs(record, prefix, grads_b, grads_d, grads_r, role, api, specs, options,
                    positions, autocast=plan.autocast, gradients=True, estimated=estimated, early=early,
                    contract=where.contract, summed=out.summed)
