"""Uniform random values of a float32, float16 or bfloat16 tensor in one compiled pass (numba).

The values are numpy's: `Generator.random(dtype=float32)` on the item's PCG64, scaled to [lo, hi] in
float32 (`u * (hi - lo) + lo`, then at most hi) and rounded once to the tensor's dtype. numpy spends
1.8 ns per element on that draw here (one indirect call per 32-bit word) and four more passes on the
arithmetic and the cast. This module takes the same 64-bit words in bulk (`random_raw`, half the calls),
splits each into its low and high 32-bit halves in numpy's order, keeps numpy's buffered half across
tensors (the generator's `has_uint32` and `uinteger`), and does the float conversion, the arithmetic and
the rounding in one pass that writes the tensor: 2.6 ns per generated bf16 element became 1.6 on
one core of an AMD EPYC (benchmarks/README.md), with every value bitwise the same (tests/test_draw.py
compares with numpy's own path). Imported with the inputs, at the first item, never at collection.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..compiled import compiled

# below it numpy's own draw is as fast (the generator's state is read and set here); a big-endian machine
# (none that torch ships wheels for) would split the words in the other order, so it keeps numpy's draw
MIN_ELEMENTS = 4096 if sys.byteorder == "little" else 1 << 62
_BLOCK = 16384  # float32 values per block of a bfloat16 fill (64 KiB)
_SCALE = np.float32(1.0 / 16777216.0)  # numpy's next_float: the top 24 bits of a 32-bit word, times 2**-24


@compiled
def _fill_f32(words: Any, span: Any, lo: Any, hi: Any, out: Any) -> None:
    """out[i] = min(u_i * span + lo, hi) in float32, u_i from the 32-bit word words[i] as numpy makes it."""
    for i in range(out.shape[0]):
        x = np.float32(words[i] >> np.uint32(8)) * _SCALE * span + lo
        out[i] = x if x < hi else hi


@compiled
def _round_bf16(values: Any, out: Any) -> None:
    """The bits of each float32 value rounded to bfloat16 (to nearest, ties to even, as torch rounds a
    finite float32)."""
    bits = values.view(np.uint32)
    for i in range(out.shape[0]):
        b = np.int64(bits[i])
        out[i] = (b + ((b >> 16) & 1) + 0x7FFF) >> 16


@compiled
def _fill_bf16(words: Any, span: Any, lo: Any, hi: Any, out: Any) -> None:
    """As _fill_f32, rounded to bfloat16 and stored as 16 bits, a block at a time through a float32
    buffer kept in cache (two functions: one loop that writes the buffer and reads its bits does not
    vectorise, and ran 3x slower)."""
    block = np.empty(_BLOCK, dtype=np.float32)
    n = out.shape[0]
    for first in range(0, n, _BLOCK):
        size = min(_BLOCK, n - first)
        _fill_f32(words[first:first + size], span, lo, hi, block[:size])
        _round_bf16(block[:size], out[first:first + size])


def _words(rng: np.random.Generator, n: int) -> tuple[Any, int]:
    """The 32-bit words numpy's float32 draws of `n` values would use: (the rest as a uint32 array,
    the buffered half first or -1), with the generator left where numpy's draw would leave it."""
    bitgen = rng.bit_generator
    state = bitgen.state
    carry = int(state["uinteger"]) if state["has_uint32"] else -1
    rest = n - (carry >= 0)
    raw = bitgen.random_raw((rest + 1) // 2)
    half = (1, int(raw[-1]) >> 32) if rest % 2 else (0, 0)
    bitgen.state = {**bitgen.state, "has_uint32": half[0], "uinteger": half[1]}
    return raw.view(np.uint32)[:rest], carry  # little-endian: the low half of each word comes first, as numpy's


def uniform_into(rng: np.random.Generator, out: Any, lo: float, hi: float) -> None:
    """Fill `out` (a float32 array, or a uint16 array holding bfloat16 bits) as
    `u = rng.random(dtype=float32); u *= hi - lo; u += lo; min(u, hi)`, rounded to bfloat16 for uint16."""
    if out.shape[0] == 0:
        return
    words, carry = _words(rng, out.shape[0])
    span, low, high = np.float32(hi - lo), np.float32(lo), np.float32(hi)
    fill = _fill_bf16 if out.dtype == np.uint16 else _fill_f32
    if carry >= 0:  # the half word numpy kept from the tensor before
        fill(np.array([carry], dtype=np.uint32), span, low, high, out[:1])
        out = out[1:]
    fill(words, span, low, high, out)
