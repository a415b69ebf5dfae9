"""A 16-bit output read as its storage: the one definition of the value of its elements.

numpy has no bf16 dtype, so a bf16 tensor used to reach the checks widened to float32 by torch (a copy of
every device output and torch run: 0.3 ns per element and 4 bytes more per element in memory). The checks
now take its storage as it is (`tensor.view(torch.int16).numpy()` seen as uint16: no copy), and the compiled
passes widen each element in registers (metrics/pairwise.value): a bf16 value is a float32 whose low 16 bits
are zero, so `bits << 16` is the value exactly. Among the float arrays of one output (bench, device, third
runs) an array of uint16 therefore always holds bf16 bits; `widen` gives its values to every numpy path that
needs them (the oracles, the careful path of non-finite outputs, the worst element's message).

An fp16 output reaches the checks as numpy's float16 (`tensor.numpy()`: its storage, no copy), which every
numpy path reads as values. numba has no float16 on CPU, so the compiled passes take it seen as int16
(`kernel_view`, no copy) and widen each element in registers (exact, every one of the 65,536 patterns as
numpy's float16 -> float32). int16 rather than another uint16 flag: numba compiles one signature per array
dtype, so the dtype alone tells the kernels fp16 storage from bf16 storage, and on the numpy side an fp16
output never looks like an integer one (a torch.int16 output stays numpy int16, never handed to a kernel).
"""
from __future__ import annotations

from typing import Any

import numpy as np

BITS = np.dtype(np.uint16)  # the dtype a bf16 output's storage is read as
HALF = np.dtype(np.int16)  # the dtype the compiled passes read an fp16 output's storage as (kernel_view)


def is_bits(values: Any) -> bool:
    """Whether `values` is a bf16 output's storage (an array of uint16 among an output's float arrays)."""
    return isinstance(values, np.ndarray) and values.dtype == BITS


def widen(values: np.ndarray) -> np.ndarray:
    """The float32 values of bf16 storage (exact); any other array as it is."""
    if not is_bits(values):
        return values
    wide = values.astype(np.uint32)
    wide <<= np.uint32(16)  # in place: a 0-d array stays an array
    return wide.view(np.float32)


def kernel_view(values: np.ndarray) -> np.ndarray:
    """What a compiled pass reads of a contiguous array: an fp16 one as its storage (int16, no copy), any other
    as it is."""
    return values.view(HALF) if values.dtype == np.float16 else values
