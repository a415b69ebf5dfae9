"""What precision each side computes in, and what rounding the inputs get: the precision plan (the bench's
raised dtype, autocast, HF32), the device's input rounding (HF32 convolutions, TF32 matmuls: both sides
read the rounded inputs), and the bench's own arguments (its dtype per tensor, a contraction's scalars in fp32,
a requested result dtype raised with the inputs, inputs rounded as an autocast kernel saw them).

Apart from placement.py (where each side runs): these choices depend on the API and the standard, not on
the device or the threads; replay.py uses the plan and the bench's dtype too.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from ..runs.execution import RAISABLE, Device, first_output_dtype, map_structure, tensors_of
from ..runs.precision import TF32_BITS, Plan, PrecisionPolicy, input_rounding, plan_precision
from ..runs.third_run import autocast_round
from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list
from .calls import round_input


class Inputs(NamedTuple):
    """An item's arguments as the sides read them: `requires_grad` holds the ids of those that take a gradient."""

    args: list[Any]
    kwargs: dict[str, Any]
    cotangents: list[Any]
    requires_grad: set[int]


def plan(api: str, inputs: Inputs, forward: dict[str, Any], specs: dict[str, Any], options: CheckOptions) -> Plan:
    """The call's precision plan (plan_precision), from its recorded output dtype."""
    return plan_precision(api, inputs.args, inputs.kwargs, first_output_dtype(forward.get("output")), specs,
                          PrecisionPolicy(options.bench_precision, options.standard))


def round_inputs(api: str, inputs: Inputs, hf32: bool, device: Device, specs: dict[str, Any],
                 notes: list[str]) -> Inputs:
    """The inputs as the device's kernel reads them, for both sides: HF32 or TF32 (input_rounding), else as they
    are."""
    rounding = input_rounding(api, hf32, device, specs)
    if rounding == "HF32":  # msprobe's rule: the positional fp32 inputs of Ascend's HF32 convolutions
        return inputs._replace(args=[round_input(a, inputs.requires_grad) for a in inputs.args])
    if rounding != "TF32":
        return inputs

    def tf32(value: Any) -> Any:  # every fp32 input the kernel reads, and the gradients its backward reads
        return round_input(value, inputs.requires_grad, TF32_BITS)

    notes.append(f"TF32: {device.kind} reads {TF32_BITS} mantissa bits of this API's fp32 inputs "
                 "(torch's setting), so they are rounded to TF32 as the kernel reads them")
    return inputs._replace(args=[map_structure(tf32, a) for a in inputs.args],
                           kwargs={k: map_structure(tf32, v) for k, v in inputs.kwargs.items()},
                           cotangents=[tf32(c) for c in inputs.cotangents])


def bench_dtype(plan: Plan) -> Callable[[torch.Tensor], torch.dtype]:
    """The dtype the bench computes a tensor in: raised by the plan, but fp32 stays fp32 under HF32."""
    def dtype_for(t: torch.Tensor) -> torch.dtype:
        if plan.raise_to is None or t.dtype not in RAISABLE or (plan.hf32 and t.dtype == torch.float32):
            return t.dtype
        return plan.raise_to

    return dtype_for


def bench_arguments(api: str, inputs: Inputs, plan: Plan, options: CheckOptions, specs: dict[str, Any],
                    notes: list[str]) -> tuple[list[Any], dict[str, Any]]:
    """The bench's arguments: the inputs, with its scalars, result dtype and autocast rounding as the kernel's."""
    bench_args, bench_kwargs = inputs.args, inputs.kwargs
    if options.standard == "strict" and error_kind(api, specs) == "contraction" and \
            not any(t.dtype == torch.float64 for t in tensors_of(inputs.args)):
        # a kernel computing in fp32 or below takes its alpha and beta as fp32: so does the bench
        scalars = specs["error_model"].get("contraction_scalars", ())
        bench_kwargs = {k: float(torch.tensor(v, dtype=torch.float32)) if k in scalars and type(v) is float else v
                        for k, v in bench_kwargs.items()}
    asked = bench_kwargs.get("dtype")
    if plan.raise_to is not None and asked in RAISABLE and asked.itemsize < plan.raise_to.itemsize:
        # the result dtype the call asks for is raised with its inputs (a narrower one makes the raised
        # bench refuse: vector_norm(x, dtype=torch.bfloat16) with x raised to fp32)
        bench_kwargs = {**bench_kwargs, "dtype": plan.raise_to}
    autocast = plan.autocast
    if autocast is not None and options.standard == "strict" and \
            in_list(specs, api, "error_model", "autocast_lower_precision"):
        # the autocast kernel computes from its inputs rounded to the autocast dtype: so does the bench
        bench_args, bench_kwargs = (map_structure(lambda v: autocast_round(v, autocast, inputs.requires_grad), x)
                                    for x in (bench_args, bench_kwargs))
        notes.append(f"autocast: the bench's inputs are rounded to {plan.autocast}, as the kernel's were")
    return bench_args, bench_kwargs
