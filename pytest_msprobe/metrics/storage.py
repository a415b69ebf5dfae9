"""A bf16 output read as its 16-bit storage: the one definition of the value of its elements.

numpy has no bf16 dtype, so a bf16 tensor used to reach the checks widened to float32 by torch (a copy of
every device output and torch run: 0.3 ns per element and 4 bytes more per element in memory). The checks
now take its storage as it is (`tensor.view(torch.int16).numpy()` seen as uint16: no copy), and the compiled
passes widen each element in registers (metrics/pairwise.value): a bf16 value is a float32 whose low 16 bits
are zero, so `bits << 16` is the value exactly. Among the float arrays of one output (bench, device, third
runs) an array of uint16 therefore always holds bf16 bits; `widen` gives its values to every numpy path that
needs them (the oracles, the careful path of non-finite outputs, the worst element's message).
"""
from __future__ import annotations

from typing import Any

import numpy as np

BITS = np.dtype(np.uint16)  # the dtype a bf16 output's storage is read as


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
