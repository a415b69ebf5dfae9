"""inputs/draw.py: the counter-based generator is SplitMix64, its compiled passes give the values of its
stated formula whatever the chunks, and its values look uniform and independent (fixed keys, so these
statistical checks are deterministic: each bound is six standard deviations or a p-value near 1e-9)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_msprobe.inputs import draw
from pytest_msprobe.inputs.build import InputError, build
from tests.helpers import tensor
from tests.test_inputs import ctx_for

MASK = (1 << 64) - 1
HALF_DTYPES = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16}


def words(key: int, first: int, n: int) -> list[int]:
    """The stream's words by the module's definition, in Python integers."""
    return [draw.mix((key + (first + i + 1) * draw.GAMMA) & MASK) for i in range(n)]


def reference_f32(key: int, first: int, n: int, lo: float, hi: float) -> np.ndarray:
    """u * (hi - lo) + lo in float32 if below hi, else hi; u = the top 24 bits times 2**-24."""
    span, low, high = np.float32(hi - lo), np.float32(lo), np.float32(hi)
    out = np.empty(n, np.float32)
    for i, w in enumerate(words(key, first, n)):
        x = np.float32(np.float32(w >> 40) * np.float32(2.0**-24) * span + low)
        out[i] = x if x < high else high
    return out


def test_the_words_are_splitmix64s_published_sequence() -> None:
    """SplitMix64 seeded with 1234567 (the known-answer values of Vigna's splitmix64.c, as listed on
    Rosetta Code's 'Pseudo-random numbers/Splitmix64')."""
    assert words(1234567, 0, 5) == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                    4593380528125082431, 16408922859458223821]
    assert [draw.tensor_key(1234567, n) for n in range(2)] == words(1234567, 0, 2)


@settings(max_examples=60, deadline=None)
@given(key=st.integers(0, MASK), first=st.integers(0, 1 << 40), n=st.integers(0, 300))
def test_the_compiled_words_are_the_definitions(key: int, first: int, n: int) -> None:
    """The int64 fill over the whole range [-2**63, 2**63 - 1] returns each word minus 2**63."""
    out = np.empty(n, np.int64)
    draw.integers_into(key, first, out, -(1 << 63), (1 << 63) - 1)
    assert [(int(v) + (1 << 63)) & MASK for v in out] == words(key, first, n)


bounds = st.floats(-6e4, 6e4, allow_subnormal=True) | st.sampled_from([0.0, -0.0, 1e-40, -1e-45, 6e-8, 65504.0])


@settings(max_examples=120, deadline=None)
@given(key=st.integers(0, MASK), first=st.integers(0, 1 << 33), n=st.integers(0, 600), a=bounds, b=bounds,
       dtype=st.sampled_from(["torch.float32", "torch.bfloat16", "torch.float16"]))
@example(key=1, first=0, n=5, a=-3.0, b=-0.0, dtype="torch.float32")  # values equal to a hi of -0.0
@example(key=7, first=3, n=400, a=-6e-8, b=6e-8, dtype="torch.float16")  # float16 subnormals
def test_the_float_values_are_the_stated_formula(key: int, first: int, n: int, a: float, b: float, dtype: str) -> None:
    """Each value is the float32 formula of the module's docstring, rounded once (as torch rounds) to the
    16-bit dtypes: the compiled rounding of bf16 and fp16 bits equals torch's."""
    lo, hi = min(a, b), max(a, b)
    expected = torch.from_numpy(reference_f32(key, first, n, lo, hi))
    if dtype == "torch.float32":
        out = np.empty(n, np.float32)
        draw.uniform_into(key, first, out, lo, hi)
        assert np.array_equal(out.view(np.uint32), expected.numpy().view(np.uint32))
    else:
        bits = np.empty(n, np.uint16)
        draw.uniform_16(key, first, bits, lo, hi, half=dtype == "torch.float16")
        assert np.array_equal(bits, expected.to(HALF_DTYPES[dtype]).view(torch.uint16).numpy())


def test_float64_values_use_53_bits_and_wide_ranges_stay_inside() -> None:
    key, n = draw.tensor_key(5, 0), 1000
    out = np.empty(n, np.float64)
    draw.uniform_into(key, 0, out, -1.0, 3.0)
    u = np.array([w >> 11 for w in words(key, 0, n)], np.float64) * 2.0**-53
    assert np.array_equal(out, np.minimum(u * 4.0 - 1.0, 3.0))
    wide = np.empty(n, np.float64)
    draw.uniform_into(key, 0, wide, -1.7e308, 1.7e308, wide=True)
    assert np.isfinite(wide).all() and (wide < 0).any() and (wide > 0).any()
    assert np.array_equal(wide, np.clip(u * 1.7e308 + (1.0 - u) * -1.7e308, -1.7e308, 1.7e308))


fills = st.sampled_from(["f32", "f64", "bf16", "f16", "int", "bool"])


def fill(kind: str, key: int, first: int, n: int) -> np.ndarray:
    holder = {"f32": np.float32, "f64": np.float64, "bf16": np.uint16, "f16": np.uint16, "int": np.int64,
              "bool": np.bool_}[kind]
    out = np.empty(n, holder)
    if kind in ("int", "bool"):
        draw.integers_into(key, first, out, -3, 1000)
    elif kind in ("bf16", "f16"):
        draw.uniform_16(key, first, out, -2.0, 5.0, half=kind == "f16")
    else:
        draw.uniform_into(key, first, out, -2.0, 5.0)
    return out


@settings(max_examples=80, deadline=None)
@given(kind=fills, key=st.integers(0, MASK), n=st.integers(1, 70_000), cuts=st.lists(st.floats(0, 1), max_size=5))
def test_any_chunking_gives_the_same_bits(kind: str, key: int, n: int, cuts: list[float]) -> None:
    """No state between elements: filling [0, n) at once or in pieces (any thread, any order) is the same."""
    whole = fill(kind, key, 0, n)
    edges = sorted({0, n, *(int(c * n) for c in cuts)})
    pieces = [fill(kind, key, start, stop - start) for start, stop in zip(edges, edges[1:])][::-1]
    assert np.array_equal(np.concatenate(pieces[::-1]), whole)


def test_build_draws_the_nth_random_tensor_of_an_item_from_stream_n(write_dump) -> None:
    """Tensor n of an item (floats, integers and bools alike) is stream tensor_key(seed, n), element i at
    flat index i; msprobe's planted Min and Max replace the first and the last element."""
    path = write_dump({})
    enc = [tensor("torch.float32", [3, 50], mx=2.0, mn=-1.0), tensor("torch.int64", [40], mx=9, mn=2),
           tensor("torch.bfloat16", [7000], mx=0.5, mn=-0.25)]
    x, i, y = build(enc, ctx_for(path, seed=11), "args")
    expected = reference_f32(draw.tensor_key(11, 0), 0, 150, -1.0, 2.0)
    expected[0], expected[-1] = -1.0, 2.0
    assert np.array_equal(x.reshape(-1).numpy(), expected)
    ints = [2 + ((w * 8) >> 64) for w in words(draw.tensor_key(11, 1), 0, 40)]
    assert i.tolist() == [2, *ints[1:-1], 9]
    halves = torch.from_numpy(reference_f32(draw.tensor_key(11, 2), 0, 7000, -0.25, 0.5)).to(torch.bfloat16)
    assert torch.equal(y[1:-1], halves[1:-1])


def uniforms(key: int, n: int = 1 << 20) -> np.ndarray:
    out = np.empty(n, np.float64)
    draw.uniform_into(key, 0, out, 0.0, 1.0)
    return out


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def bound(df: int) -> float:
    """chi-square with df degrees of freedom: mean df, standard deviation sqrt(2 df); six of them."""
    return df + 6 * math.sqrt(2 * df)


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_values_are_uniform_in_the_top_and_the_low_bits(seed: int) -> None:
    u = uniforms(draw.tensor_key(seed, 0))
    assert chi_square(np.bincount((u * 1024).astype(np.int64), minlength=1024)) < bound(1023)
    low = (u * 2.0**40).astype(np.int64) & 1023  # bits 31-40 of the 53 a float64 uses
    assert chi_square(np.bincount(low, minlength=1024)) < bound(1023)
    pairs = (u[0::2] * 32).astype(np.int64) * 32 + (u[1::2] * 32).astype(np.int64)  # neighbours, 2-d
    assert chi_square(np.bincount(pairs, minlength=1024)) < bound(1023)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1])
def test_neighbours_tensors_and_items_are_uncorrelated(seed: int) -> None:
    """Lag-1 and lag-2 within a stream, the item's next tensor, and the item seed + 1 (the cotangents of a
    backward item use it): each correlation within six standard deviations (6 / sqrt(n)) of zero."""
    n = 1 << 20
    u = uniforms(draw.tensor_key(seed, 0), n)
    limit = 6 / math.sqrt(n)
    assert abs(correlation(u[:-1], u[1:])) < limit and abs(correlation(u[:-2], u[2:])) < limit
    assert abs(correlation(u, uniforms(draw.tensor_key(seed, 1), n))) < limit
    assert abs(correlation(u, uniforms(draw.tensor_key(seed + 1, 0), n))) < limit
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / n)


def test_integers_and_bools_are_uniform() -> None:
    n = 1 << 20
    ints = np.empty(n, np.int64)
    draw.integers_into(draw.tensor_key(3, 0), 0, ints, -4, 5)
    assert ints.min() == -4 and ints.max() == 5
    assert chi_square(np.bincount(ints + 4, minlength=10)) < bound(9)
    flags = np.empty(n, np.bool_)
    draw.integers_into(draw.tensor_key(3, 1), 0, flags, 0, 1)
    assert abs(int(flags.sum()) - n / 2) < 6 * math.sqrt(n / 4)
    one = np.empty(100, np.int64)
    draw.integers_into(1, 0, one, 2**62, 2**62)
    assert (one == 2**62).all()


def test_integer_statistics_beyond_int64_are_refused(write_dump) -> None:
    with pytest.raises(InputError, match=r"arg: integer statistics Min=0 Max=\d+ are beyond int64"):
        build(tensor("torch.int64", [8], mx=2.0**70, mn=0), ctx_for(write_dump({})), "arg")


def test_16_bit_rounding_is_torchs_at_ties_and_subnormals() -> None:
    """A range of one value [v, v] writes v rounded: exact ties (to even, both ways), float16 subnormals and
    its largest values, against torch's own rounding (an exhaustive run over every float32 in float16's
    range, 2.4 billion values, agreed too when it was run once)."""
    rng = np.random.default_rng(0)
    base = rng.integers(0x3000_0000, 0x4700_0000, 2000, dtype=np.uint32)
    ties_bf16 = (base & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    ties_f16 = (base & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    sub = np.arange(0, 2**-14, 2**-27, dtype=np.float32)  # float16 subnormals, ties among them
    values = np.concatenate([ties_bf16.view(np.float32), ties_f16.view(np.float32), sub,
                             np.array([65504.0, 65519.0, 2**-24, 2**-25, 3 * 2**-25], np.float32)])
    values = np.concatenate([values, -values])
    for name, dtype in HALF_DTYPES.items():
        one = np.empty(1, np.uint16)
        got = []
        for v in values:
            draw.uniform_16(3, 0, one, float(v), float(v), half=name == "torch.float16")
            got.append(int(one[0]))
        assert got == torch.from_numpy(values).to(dtype).view(torch.uint16).numpy().tolist(), name


def test_a_journal_of_another_generator_is_rerun_on_resume(monkeypatch) -> None:
    """Records of a journal written with other random inputs for the same seeds are not reused."""
    from pytest_msprobe.session import journal
    from pytest_msprobe.settings import CheckOptions, Settings

    settings = Settings(CheckOptions(device="cpu"))
    ours = journal.run_fingerprint(settings)
    monkeypatch.setattr(journal, "GENERATOR", "pcg64-numpy")
    assert journal.run_fingerprint(settings) != ours
