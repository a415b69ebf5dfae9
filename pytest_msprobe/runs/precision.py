"""What precision each side of a call computes in: the bench's raised dtypes and autocast (`plan_precision`, from
api_specs' precision tables and the standard), and the rounding a device's kernel applies to fp32 inputs
(`input_rounding`: Ascend's HF32 convolutions, CUDA's TF32 where torch's settings say so; `round_mantissa`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..specs.loader import error_kind
from .execution import Device, tensors_of


@dataclass
class Plan:
    """How the two sides treat dtypes for one call."""

    raise_to: torch.dtype | None
    autocast: torch.dtype | None
    hf32: bool


class PrecisionPolicy(NamedTuple):
    """How a call's bench dtypes are chosen: msprobe_bench_precision ("auto" or "fp64") and the standard."""
    policy: str = "auto"
    standard: str = "msprobe"


def plan_precision(api_name: str, args: Any, kwargs: dict[str, Any], output_dtype: torch.dtype | None,
                   specs: dict[str, Any], chosen: PrecisionPolicy | None = None) -> Plan:
    """Bench dtypes and autocast for one call. `chosen.policy`: "auto" is msprobe's raise rule with the per-API
    tables of api_specs (precision.raise_map_by_api), and under `strict` its own per-API tables
    (precision.strict_raise_map_by_api) and the elementwise functions' table
    (precision.strict_elementwise_raise_map); "fp64" raises every float dtype to fp64."""
    policy, standard = chosen or PrecisionPolicy()
    rules = specs["precision"]
    table, mixed = rules["raise_map"], rules["mixed_raise_to"]
    by_api = rules.get("raise_map_by_api", {})
    if policy == "fp64":
        table, mixed = {k: "torch.float64" for k in rules["raise_map"]}, "torch.float64"
    elif standard == "strict" and api_name in rules.get("strict_raise_map_by_api", {}):
        table = rules["strict_raise_map_by_api"][api_name]
    elif api_name in by_api:
        table = by_api[api_name]
    elif standard == "strict" and error_kind(api_name, specs) == "elementwise":
        table = rules["strict_elementwise_raise_map"]
    raise_map = {getattr(torch, k.split(".")[1]): getattr(torch, v.split(".")[1]) for k, v in table.items()}
    dtypes = {t.dtype for t in tensors_of(args) + tensors_of(kwargs) if t.dtype in raise_map}
    autocast_dtype: torch.dtype | None = None
    is_autocast = False
    raise_to: torch.dtype | None = None
    if len(dtypes) == 1:
        (only,) = dtypes
        raise_to, autocast_dtype = raise_map[only], only
    elif len(dtypes) >= 2:
        raise_to = getattr(torch, mixed.split(".")[1])
        low = sorted((d for d in dtypes if d != torch.float32), key=str)
        autocast_dtype, is_autocast = (low[0] if low else None), True
    if api_name in rules.get("not_raise", []) or api_name in rules.get("bitcast", []) and any(
            isinstance(a, torch.dtype) for a in [*args, *kwargs.values()]):
        raise_to = None
    if not is_autocast and output_dtype is not None:
        is_autocast = autocast_dtype != output_dtype
        autocast_dtype = output_dtype
    # Autocast only means something for a 16-bit target; msprobe's fp32 autocast is a no-op.
    autocast = autocast_dtype if is_autocast and autocast_dtype in (torch.float16, torch.bfloat16) else None
    return Plan(raise_to, autocast, api_name in rules.get("hf32", []))


HF32_BITS, TF32_BITS = 11, 10  # mantissa bits an Ascend cube (HF32) and an NVIDIA tensor core (TF32) read


def round_mantissa(t: torch.Tensor, bits: int) -> torch.Tensor:
    """Round fp32 to `bits` mantissa bits, half away from zero (HF32: 11 bits, as Ascend cubes do; TF32:
    10), so that a kernel reading that many bits reads the value exactly. inf and NaN stay."""
    drop = 23 - bits
    raw = t.contiguous().view(torch.int32)
    raw = ((raw >> (drop - 1)) + 1) >> 1 << drop
    return raw.view(torch.float32).reshape(t.shape)


def input_rounding(api_name: str, hf32: bool, device: Device, specs: dict[str, Any]) -> str | None:
    """"TF32" where the device reads only TF32 of this API's fp32 inputs (its backend says so for the
    API's family in api_specs precision.tf32: CUDA's cuDNN convolutions by default, its matrix products
    when allowed), else "HF32" for msprobe's Ascend list (`hf32`, on every device), else None."""
    families = specs["precision"].get("tf32") or {}
    reads = getattr(device.backend, "reads_tf32", None)
    if reads is not None and any(api_name in apis and reads(family) for family, apis in families.items()):
        return "TF32"
    return "HF32" if hf32 else None


__all__ = ["HF32_BITS", "TF32_BITS", "Plan", "PrecisionPolicy", "input_rounding", "plan_precision", "round_mantissa"]
