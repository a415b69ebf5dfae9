"""The device dtype's grid: rounding to it, and the spacing of its values (one ULP), for fp16, bf16, fp32 and
fp64 held in numpy arrays. The strict standard counts errors in these units; the streamed checks, the torch
checks and the HTML report's ULP view read the same grid, so it lives apart from any one of them.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

# mantissa bits and smallest normal exponent of each device dtype
FORMATS = {
    "torch.float16": (10, -14),
    "torch.bfloat16": (7, -126),
    "torch.float32": (23, -126),
    "torch.float64": (52, -1022),
}
SHARED = 1 << 15  # elements up to which filled hands out one shared read-only array


def supported(device_dtype: str) -> bool:
    return device_dtype in FORMATS


def round_to(values: np.ndarray, device_dtype: str, all_finite: bool = False,
             work: type[np.floating[Any]] = np.float64) -> np.ndarray:
    """Round values to the device dtype, returned in `work` (float64, or float32 for 16-bit dtypes);
    bf16 via fp32, as a kernel would."""
    if device_dtype == "torch.float16":
        return values.astype(np.float16).astype(work)
    if device_dtype == "torch.float32":
        return values.astype(np.float32).astype(work)
    if device_dtype == "torch.bfloat16":
        bits = values.astype(np.float32, copy=False).view(np.uint32)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        if not all_finite:
            rounded = np.where(np.isfinite(values), rounded, bits)
        return rounded.view(np.float32).astype(work, copy=False)
    return values.astype(np.float64)


def ulp(values: np.ndarray, device_dtype: str) -> np.ndarray:
    """Spacing of the device dtype at |values| (the subnormal spacing below the normal range), in the
    values' own float dtype when it is float32, else in float64.

    From the exponent bits (every fp16/bf16 value is a normal float32, every fp32 one a normal
    float64); 0 counts as the smallest normal binade.
    """
    mantissa, emin = FORMATS[device_dtype]
    a = np.asarray(values)
    if a.dtype == np.float32 and device_dtype != "torch.float64":
        binade = (a.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32)  # 2**floor(log2|v|), sign cleared
    else:
        binade = (a.astype(np.float64, copy=False).view(np.uint64) & np.uint64(0x7FF0000000000000)).view(np.float64)
    np.maximum(binade, filled(2.0 ** emin, binade.size, binade.dtype).reshape(binade.shape), out=binade)
    binade *= binade.dtype.type(2.0 ** -mantissa)
    return binade


def filled(value: float, n: int, dtype: np.dtype[Any]) -> np.ndarray:
    """`n` copies of `value` (read-only, shared up to a block): numpy's maximum with a scalar is 3-5x
    slower than with an array of it."""
    return _block_of(float(value), np.dtype(dtype))[:n] if n <= SHARED else np.full(n, value, dtype=dtype)


@functools.lru_cache(maxsize=32)
def _block_of(value: float, dtype: np.dtype[Any]) -> np.ndarray:
    array = np.full(SHARED, value, dtype=dtype)
    array.flags.writeable = False
    return array


def work_dtype(device_dtype: str) -> type[np.floating[Any]]:
    """float32 holds every fp16/bf16 value and their errors against an fp32 bench to 2**-24 of an fp32
    ULP, far below the 16-bit ULPs judged, at half the memory traffic of float64."""
    return np.float32 if device_dtype in ("torch.float16", "torch.bfloat16") else np.float64


def accumulation_roundoff(device_dtype: str) -> float:
    """Unit roundoff of the accumulator a correct kernel uses: fp32 up to fp32 outputs, else fp64."""
    return 2.0 ** -53 if device_dtype == "torch.float64" else 2.0 ** -24
