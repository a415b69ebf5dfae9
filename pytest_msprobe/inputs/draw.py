"""The random values of a tensor drawn from statistics: a counter-based generator in compiled passes (numba).

Element `i` of a tensor drawn with stream key `k` comes from the 64-bit word `mix(k + (i + 1) * GAMMA)`, where
`mix` is the finaliser of SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; the variant of Stafford's Mix13 that java.util.SplittableRandom and Vigna's
splitmix64.c use) and GAMMA the golden-ratio increment. The words of one key are exactly SplitMix64's
output sequence seeded with `k`, a generator that passes TestU01's BigCrush. No state passes from one
element to the next: each value depends only on (key, index), so a tensor may be filled in any chunks, by
any thread, in any order, with the same bits; the loop vectorises (0.3-0.4 ns per element on one core of an
AMD EPYC with AVX-512, benchmarks/README.md).

Keys: `tensor_key(seed, n)` is the n-th SplitMix64 word of the item's seed, so every random tensor of an
item has its own stream, fixed by the item's seed and the tensor's place among the item's random tensors.
Two streams overlap only if their keys differ by less than a tensor's length times GAMMA (mod 2**64):
about numel / 2**64 for two keys that are themselves SplitMix64 words.

Values: a float in [lo, hi] is `u * (hi - lo) + lo`, at most hi, with u the word's top 24 bits times 2**-24
computed in float32 (the top 53 bits times 2**-53 in float64 for float64 tensors) and rounded once to the
tensor's dtype (bfloat16 and float16 bits are written here: round to nearest, ties to even, as torch rounds);
a range too wide for `hi - lo` is drawn as the convex combination `u * hi + (1 - u) * lo` in float64, which
cannot overflow. An integer in [lo, hi] is `lo + floor(word * (hi - lo + 1) / 2**64)` (Lemire's
multiply-shift, bias below (hi - lo + 1) / 2**64). Imported with the inputs, at the first item, never at
collection.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..compiled import compiled

GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment: 2**64 / the golden ratio, odd
_MASK = (1 << 64) - 1
_G = np.uint64(GAMMA)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30, _S31, _S32, _S40 = (np.uint64(s) for s in (11, 27, 30, 31, 32, 40))
_LOW32 = np.uint64(0xFFFFFFFF)
_SCALE24 = np.float32(1.0 / 16777216.0)  # 2**-24: a float32 in [0, 1) from 24 bits
_SCALE53 = 1.0 / 9007199254740992.0  # 2**-53
_BLOCK = 16384  # float32 values per block of a 16-bit fill (64 KiB, kept in cache)


def mix(z: int) -> int:
    """SplitMix64's finaliser in Python integers (the compiled passes inline the same arithmetic)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def tensor_key(seed: int, n: int) -> int:
    """The stream key of the n-th (from 0) random tensor drawn with `seed`: SplitMix64's n-th word."""
    return mix((seed + (n + 1) * GAMMA) & _MASK)


@compiled
def _word(key: Any, i: Any) -> Any:
    """The 64-bit word of element i: mix(key + (i + 1) * GAMMA)."""
    z = key + np.uint64(i + 1) * _G
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@compiled
def _fill_f32(key: Any, first: Any, span: Any, lo: Any, hi: Any, out: Any) -> None:
    """out[j] = min(u * span + lo, hi) in float32 for element first + j (key: the uint64 key as an int64,
    the bounds as float64 numbers: numba's dispatch of plain Python numbers costs 10x less than of numpy
    scalars)."""
    key, span, lo, hi = np.uint64(key), np.float32(span), np.float32(lo), np.float32(hi)
    for j in range(out.shape[0]):
        x = np.float32(_word(key, first + j) >> _S40) * _SCALE24 * span + lo
        out[j] = x if x < hi else hi


@compiled
def _fill_f64(key: Any, first: Any, lo: Any, hi: Any, wide: Any, out: Any) -> None:
    """out[j] in float64 for element first + j: min(u * (hi - lo) + lo, hi), or for a `wide` range the
    convex combination clipped to [lo, hi]."""
    key, span = np.uint64(key), hi - lo
    for j in range(out.shape[0]):
        u = np.float64(_word(key, first + j) >> _S11) * _SCALE53
        x = u * hi + (1.0 - u) * lo if wide else u * span + lo
        out[j] = min(max(x, lo), hi)


@compiled
def _round_bf16(values: Any, out: Any) -> None:
    """The bits of each finite float32 value rounded to bfloat16 (to nearest, ties to even)."""
    bits = values.view(np.uint32)
    for i in range(out.shape[0]):
        b = np.int64(bits[i])
        out[i] = (b + ((b >> 16) & 1) + 0x7FFF) >> 16


@compiled
def _round_f16(values: Any, out: Any) -> None:
    """The bits of each finite float32 value of float16's range rounded to float16 (to nearest, ties to even):
    a subnormal result is |x| in units of 2**-24 rounded by rint; a normal one rebiases the exponent and
    rounds the mantissa at bit 13 (F. Giesen's float_to_half_fast3_rtne, without its inf/NaN branch)."""
    bits = values.view(np.uint32)
    for i in range(out.shape[0]):
        b = np.int64(bits[i])
        a = b & 0x7FFFFFFF
        sign = (b >> 16) & 0x8000
        if a < (113 << 23):  # below 2**-14: float16 subnormal or zero
            o = np.int64(np.rint(abs(values[i]) * np.float32(16777216.0)))
        else:
            o = (a - (112 << 23) + 0xFFF + ((a >> 13) & 1)) >> 13
        out[i] = o | sign


@compiled
def _fill_16(key: Any, first: Any, span: Any, lo: Any, hi: Any, half: Any, out: Any) -> None:
    """A compiled kernel: as _fill_f32, rounded to bfloat16 (or float16 when `half`) and stored as 16 bits, a block at a time
    through a float32 buffer kept in cache (one loop that writes the buffer and reads its bits does not
    vectorise, and ran 3x slower)."""
    span, lo, hi = np.float32(span), np.float32(lo), np.float32(hi)
    block = np.empty(_BLOCK, dtype=np.float32)
    n = out.shape[0]
    for start in range(0, n, _BLOCK):
        size = min(_BLOCK, n - start)
        _fill_f32(key, first + start, span, lo, hi, block[:size])
        if half:
            _round_f16(block[:size], out[start:start + size])
        else:
            _round_bf16(block[:size], out[start:start + size])


@compiled
def _bounded(word: Any, span: Any) -> Any:
    """floor(word * span / 2**64) for span > 0 (the high half of the 128-bit product); word itself for a
    span of 2**64, given as 0."""
    if span == 0:
        return word
    a_lo, a_hi = word & _LOW32, word >> _S32
    b_lo, b_hi = span & _LOW32, span >> _S32
    t = a_hi * b_lo + ((a_lo * b_lo) >> _S32)
    u = a_lo * b_hi + (t & _LOW32)
    return a_hi * b_hi + (t >> _S32) + (u >> _S32)


@compiled
def _fill_int(key: Any, first: Any, low: Any, span: Any, out: Any) -> None:
    """out[j] = low + floor(word * span / 2**64) for element first + j, in int64 (two's complement)."""
    key, low, span = np.uint64(key), np.uint64(low), np.uint64(span)
    for j in range(out.shape[0]):
        out[j] = np.int64(low + _bounded(_word(key, first + j), span))


@compiled
def _fill_bool(key: Any, first: Any, low: Any, span: Any, out: Any) -> None:
    """out[j] = (low + floor(word * span / 2**64)) > 0 for element first + j."""
    key, low, span = np.uint64(key), np.uint64(low), np.uint64(span)
    for j in range(out.shape[0]):
        out[j] = np.int64(low + _bounded(_word(key, first + j), span)) > 0


def uniform_into(key: int, first: int, out: Any, lo: float, hi: float, *, wide: bool = False) -> None:
    """Fill the float32 or float64 array `out` with elements first, first + 1, ... of stream `key` in
    [lo, hi] (16-bit dtypes: uniform_16). A `wide` range (hi - lo beyond the dtype's largest value) is drawn
    into a float64 `out`."""
    if out.dtype == np.float64:
        _fill_f64(_signed(key), first, float(lo), float(hi), wide, out)
    elif out.dtype == np.float32:
        _fill_f32(_signed(key), first, float(hi - lo), float(lo), float(hi), out)
    else:
        raise TypeError(f"uniform_into fills float32 or float64, not {out.dtype}")


def uniform_16(key: int, first: int, out: Any, lo: float, hi: float, *, half: bool) -> None:
    """Fill the uint16 array `out` with the bits of elements first, ... of stream `key` in [lo, hi], as
    float16 (`half`) or bfloat16, drawn in float32 and rounded once."""
    _fill_16(_signed(key), first, float(hi - lo), float(lo), float(hi), half, out)


def integers_into(key: int, first: int, out: Any, low: int, high: int) -> None:
    """Fill the int64 (or bool: value > 0) array `out` with integers in [low, high], both within int64."""
    fill = _fill_bool if out.dtype == np.bool_ else _fill_int
    fill(_signed(key), first, _signed(low), _signed(high - low + 1), out)


def _signed(value: int) -> int:
    """`value` mod 2**64 as a signed 64-bit number (the compiled passes take it back as uint64)."""
    value &= _MASK
    return value - (1 << 64) if value >> 63 else value


def warm_up() -> None:
    """Load (or compile) every pass in the signatures inputs/build.py calls."""
    for holder in (np.float32, np.float64):
        uniform_into(1, 0, np.empty(4, holder), -1.0, 1.0)
    uniform_into(1, 0, np.empty(4, np.float64), -1.0, 1.0, wide=True)
    for half in (False, True):
        uniform_16(1, 0, np.empty(4, np.uint16), -1.0, 1.0, half=half)
    integers_into(1, 0, np.empty(4, np.int64), 0, 1)
    integers_into(1, 0, np.empty(4, np.bool_), 0, 1)
