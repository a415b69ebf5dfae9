"""The device dtype's grid (verdict/grid.py) as compiled element loops: rounding to fp16, bf16 or fp32, the ULP
of a value, the flush-to-zero rule, and numpy's NaN-winning maximum. The strict pass (verdict/strict/numba_kernel.py)
calls them inside its loops, and numba compiles them into it; they repeat grid.py's numpy arithmetic
operation by operation, so both give the same bits.

numba's on-disk cache of a caller is keyed on its own file: after editing this module, clear the
`__pycache__/*.nbi` files of verdict/ (or set NUMBA_CACHE_DIR to a fresh folder) before timing or testing.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..compiled import compiled
from ..metrics.pairwise import half_rounded


@compiled
def nan_max(a: Any, b: Any) -> Any:
    """np.maximum: NaN wins."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


@compiled
def unflush_into(values: Any, bench: Any, rounded: Any, n: int, tiny: Any, zero: Any) -> None:
    """A zero where |bench| lies below the device dtype's normal range (`tiny`) becomes the correctly
    rounded bench: flushing a subnormal result to zero is not an error (strict's flush-to-zero rule)."""
    for j in range(n):
        values[j] = rounded[j] if values[j] == zero and abs(bench[j]) < tiny else values[j]


@compiled
def round_into(src: Any, dst: Any, n: int, fmt: int) -> None:
    """dst[:n] = src[:n] correctly rounded to the device dtype (grid.round_to, all_finite): bf16 by the
    float32 bit trick, fp16 to nearest even with its subnormals and overflow (pairwise.half_rounded), fp32 by a
    cast."""
    if fmt == 0:
        for j in range(n):
            dst[j] = bf16_rounded(src[j])
    elif fmt == 1:  # numpy's float32 -> fp16 -> float32, without a branch (vector code)
        for j in range(n):
            dst[j] = half_rounded(src[j])
    elif fmt == 2:
        for j in range(n):
            dst[j] = np.float32(src[j])
    else:
        for j in range(n):
            dst[j] = src[j]


@compiled
def bf16_rounded(v: Any) -> Any:
    """A float32 rounded to bf16 (to nearest even), as a float32: the bit trick."""
    x = np.int64(np.float32(v).view(np.uint32))
    return np.uint32(((x + (((x >> 16) & 1) + 0x7FFF)) & 0xFFFF0000) & 0xFFFFFFFF).view(np.float32)


@compiled
def prepare_16(b: Any, bw: Any, rw: Any, uw: Any, n: int, tiny: Any, step: Any, fmt: int) -> None:
    """numba_kernel's _load, round_into and ulp_into of a 16-bit output's chunk in one loop, in registers: the bench in float32 (bw),
    rounded to the device dtype (rw: bf16 by the float32 bit trick, fp16 by pairwise.half_rounded), and the
    ULP of that (uw). A compiled kernel: its arrays and constants come as arguments."""
    for j in range(n):
        v = np.float32(b[j])
        r = bf16_rounded(v) if fmt == 0 else half_rounded(v)
        bw[j], rw[j] = v, r
        uw[j] = nan_max(np.uint32(np.float32(r).view(np.uint32) & np.uint32(0x7F800000)).view(np.float32), tiny) * step


@compiled
def ulp_into(src: Any, dst: Any, n: int, emin: Any, step: Any) -> None:
    """dst[:n] = grid.ulp(src[:n]): the exponent bits, at least 2**emin, times 2**-mantissa."""
    if src.itemsize == 4:
        bits, out = src.view(np.uint32), dst.view(np.uint32)
        for j in range(n):
            out[j] = bits[j] & np.uint32(0x7F800000)
    else:
        bits64, out64 = src.view(np.uint64), dst.view(np.uint64)
        for j in range(n):
            out64[j] = bits64[j] & np.uint64(0x7FF0000000000000)
    for j in range(n):
        dst[j] = nan_max(dst[j], emin) * step


@compiled
def unflushed(v: Any, bj: Any, r: Any, tiny: Any, zero: Any) -> Any:
    """A device or torch-run value, with a zero where the bench lies below the device dtype's normal range
    taken as the correctly rounded result `r` (flushing a subnormal result is not an error)."""
    return r if (v == zero) & (abs(bj) < tiny) else v
