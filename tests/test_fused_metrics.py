"""msprobe's metric columns from the compiled pass (metrics/numba_kernel.py, metrics/fused.py) against numpy's
(metrics/vectorised.py, the oracle): the same arrays give the same row, bit for bit, except two sums
taken in another order (stats.py): the cosine (float64 dot products, within 1e-12) and the mean relative
error where some elements are small or non-finite (within 1e-5 relative; bitwise where none is)."""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_msprobe.metrics import fused, storage
from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import grid, standards

SPECS = load_specs()
DTYPES = ["torch.bfloat16", "torch.float16", "torch.float32", "torch.float64"]
# one API of each of msprobe 8.x's algorithms (categories.yaml), and one under msprobe 26.x
APIS = ["gelu", "linear", "add", "conv2d", "test_api", "__and__", "equal"]
SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45, -1e-45, 2.0 ** -133, 2.0 ** -126, 5.96e-8, 6.1e-5,
           65504.0, 65520.0, -65519.0, 3.3895e38, 3.4028235e38, 1e300, 1e-300, 1.0, -1.0, 0.5, 1.5,
           1.9999999, 0.99999994, 2.0 ** 127 * 1.9999998, 9.5367431640625e-07, 0.0009765625]


@contextmanager
def numpy_metrics() -> Iterator[None]:
    """standards' numpy path (the oracle) for every pair."""
    original = fused.supported
    fused.supported = lambda *args, **kwargs: False  # type: ignore[assignment]
    try:
        yield
    finally:
        fused.supported = original


def _key(x: Any) -> Any:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else (x, math.copysign(1.0, x))
    return x


def _close(a: float | None, b: float | None, rel: float) -> bool:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return _key(a) == _key(b)
    return abs(a - b) <= rel * max(abs(a), abs(b))


def both(b: np.ndarray, d: np.ndarray, dtype: str, api: str, standard: str = "msprobe") -> tuple[Any, Any]:
    """(compiled row, numpy row) of one pair, after checking they agree; the compiled path must be taken."""
    kwargs = {"bench_dtype": str(b.dtype), "device_dtype": dtype,
              "judging": standards.Judging(api, SPECS, standard)}
    # a bf16 output reaches the compiled pass as its 16-bit storage (as in a run), the oracle as float32 values
    fast = standards.compare_tensor("x", b, _stored(d) if dtype == "torch.bfloat16" else d, **kwargs)
    with numpy_metrics():
        slow = standards.compare_tensor("x", b, d, **kwargs)
    assert (fast.status, fast.message, fast.algorithm) == (slow.status, slow.message, slow.algorithm)
    assert {k: _key(v) for k, v in (fast.worst or {}).items()} == {k: _key(v) for k, v in (slow.worst or {}).items()}
    for k, v in fast.metrics.items():
        w = slow.metrics[k]
        if k == "cosine":
            assert _close(v, w, 1e-12), (k, v, w)
        elif k == "mean_rel_err" and v is not None and w is not None:
            assert _close(v, w, 1e-5), (k, v, w)
        else:
            assert _key(v) == _key(w), (k, v, w)
    return fast, slow


def _stored(values: np.ndarray) -> np.ndarray:
    """The bf16 storage of float32-held bf16 values, where it widens back to the very same bits (exact copies
    of the bench, drawn below, may not be bf16 values)."""
    bits = np.asarray(values.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return bits if storage.widen(bits).tobytes() == values.tobytes() else values  # else not bf16 values: as they are


def _device(rng: np.random.Generator, bench: np.ndarray, dtype: str, spread: float) -> np.ndarray:
    """The bench moved by a relative error of about `spread`, rounded to the dtype, in its numpy holder."""
    with np.errstate(all="ignore"):
        moved = bench.astype(np.float64) * (1 + spread * rng.standard_normal(bench.shape))
        out = grid.round_to(moved.reshape(-1), dtype).reshape(bench.shape)
    return out.astype(np.float16 if dtype == "torch.float16" else np.float64 if dtype == "torch.float64"
                      else np.float32)


elements = st.one_of(st.sampled_from(SPECIAL), st.floats(-1e4, 1e4, width=32),
                     st.floats(-2.0 ** -10, 2.0 ** -10, width=32), st.floats(allow_nan=True, allow_infinity=True, width=64))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # any float64, cast to 16 bits
@settings(max_examples=400, deadline=None)
@given(dtype=st.sampled_from(DTYPES), api=st.sampled_from(APIS), values=st.lists(elements, max_size=300),
       seed=st.integers(0, 2 ** 32 - 1), spread=st.sampled_from([0.0, 1e-4, 1e-2, 1.0]), bench64=st.booleans(),
       zero_d=st.booleans(), standard=st.sampled_from(["msprobe", "msprobe26"]), holes=st.booleans())
def test_the_compiled_metrics_equal_the_numpy_oracle(dtype: str, api: str, values: list[float], seed: int,
                                                     spread: float, bench64: bool, zero_d: bool, standard: str,
                                                     holes: bool) -> None:
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        bench = np.array(values, dtype=np.float64 if bench64 or dtype in ("torch.float32", "torch.float64")
                         else np.float32)
    if zero_d and bench.size:
        bench = bench[:1].reshape(())
    device = _device(rng, bench, dtype, spread)
    if holes and device.size:  # NaN and inf on the device side only, and exact elements
        flat = device.reshape(-1)
        flat[rng.random(flat.size) < 0.1] = np.nan
        flat[rng.random(flat.size) < 0.1] = -np.inf
        exact = rng.random(flat.size) < 0.2
        flat[exact] = bench.reshape(-1)[exact]
    both(bench, device, dtype, api, standard)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("api", APIS)
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 40 binades: beyond fp16's range
def test_large_outputs_are_the_oracles(dtype: str, api: str) -> None:
    """Many chunks and pairwise leaves, magnitudes over 40 binades (small values, subnormals of the
    dtype), some exact elements: every column the same (the mean relative error within 1e-5)."""
    rng = np.random.default_rng(11)
    n = 300_001
    bench = (rng.standard_normal(n) * np.exp(rng.uniform(-14, 14, n))).astype(
        np.float64 if dtype in ("torch.float32", "torch.float64") else np.float32)
    device = _device(rng, bench, dtype, 3e-3)
    device[::5] = bench[::5].astype(device.dtype)
    fast, _ = both(bench, device, dtype, api)
    assert fast.metrics["cosine"] is not None


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float16", "torch.float32"])
def test_mean_relative_error_is_bitwise_numpys_where_every_element_is_normal(dtype: str) -> None:
    rng = np.random.default_rng(2)
    bench = (rng.uniform(1, 2, 100_003) * rng.choice([-1, 1], 100_003)).astype(
        np.float64 if dtype == "torch.float32" else np.float32)
    fast, slow = both(bench, _device(rng, bench, dtype, 1e-2), dtype, "gelu")
    assert fast.metrics["mean_rel_err"] == slow.metrics["mean_rel_err"] and fast.metrics["rmse"] == slow.metrics["rmse"]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # every float32 exponent, the top ones
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # overflow to inf, NaN bit patterns
def test_ulp_exponents_follow_numpys_log2_across_float32_bit_patterns() -> None:
    """msprobe's ULP unit is 2**floor(log2|b|) with numpy's log2, which rounds up just below a power of
    two: a sweep of float32 bit patterns (every exponent, the top mantissas of each) gives numpy's ULP
    columns, and the same holds for float64 benches at the top of each binade."""
    bits = np.concatenate([np.arange(0, 1 << 31, 7919, dtype=np.uint64),
                           (np.arange(1, 255, dtype=np.uint64)[:, None] << np.uint64(23)
                            | (np.uint64((1 << 23) - 64) + np.arange(64, dtype=np.uint64))[None, :]).ravel()])
    bench = bits.astype(np.uint32).view(np.float32)
    device = bench * np.float32(1.0 + 2.0 ** -7)
    for dtype in ("torch.bfloat16", "torch.float16"):
        fast, _ = both(bench, device, dtype, "linear")
        assert fast.algorithm == "ulp_compare"
    # benches whose scale is 2**127, which numpy's float32 exp2 gives one ULP high: that value is used
    tiny = np.float32(2.0 ** -120) * np.linspace(1, 1.99, 5000, dtype=np.float32)
    fast, slow = both(tiny, tiny * np.float32(1.5), "torch.bfloat16", "linear")
    assert fast.metrics["max_ulp_err"] == slow.metrics["max_ulp_err"] != 2.0 ** 127 * 2.0 ** -121
    top = (np.arange(1, 2047, dtype=np.uint64)[:, None] << np.uint64(52)
           | (np.uint64((1 << 52) - 256) + np.arange(0, 256, 17, dtype=np.uint64))[None, :]).ravel()
    bench64 = top.view(np.float64)
    bench64 = bench64[np.abs(bench64) < 1e38]
    both(bench64, (bench64 * (1 + 2.0 ** -20)).astype(np.float32), "torch.float32", "linear")


def test_unsupported_pairs_take_numpys_path() -> None:
    """A float64 device output beside a float32 bench (error dtype float64, not the bench's) is left to
    numpy, with the same row as before."""
    bench = np.linspace(-2, 2, 1000, dtype=np.float32)
    assert not fused.supported(bench, bench.astype(np.float64), np.dtype(np.float64))
    both(bench, bench.astype(np.float64) * (1 + 1e-9), "torch.float64", "gelu")


def test_an_output_of_more_than_2_to_the_24_elements_is_the_oracles() -> None:
    """Counts and the pairwise tree beyond float32's exact integers (numpy divides the mean in float64)."""
    rng = np.random.default_rng(4)
    n = (1 << 24) + 3
    bench = rng.standard_normal(n, dtype=np.float32)
    device = _device(rng, bench, "torch.bfloat16", 1e-2)
    fast, slow = both(bench, device, "torch.bfloat16", "gelu")
    assert fast.metrics["rmse"] == slow.metrics["rmse"] and fast.metrics["error_balance"] == slow.metrics["error_balance"]


@pytest.mark.parametrize("api", APIS)
def test_a_bf16_output_beside_a_float64_bench_is_read_in_place(api: str) -> None:
    """The storage of a bf16 output and its float64 bench go to the compiled pass as they are (the bench rounded
    to float32, msprobe's error dtype, a chunk at a time): every column the oracle's, non-finite benches too."""
    rng = np.random.default_rng(12)
    n = 200_003
    bench = rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))
    bench[rng.random(n) < 1e-4] = np.inf
    bench[:7] = [1e300, -1e300, 3.4028235677973366e38, 3.4028235e38 * (1 + 2 ** -30), 1e-300, -0.0, np.nan]
    with np.errstate(over="ignore"):  # 1e300 becomes inf in float32, as intended
        device = _device(rng, bench.astype(np.float32), "torch.bfloat16", 3e-3)
    assert fused.supported(bench, _stored(device), np.dtype(np.float32), None, np.dtype(np.float32))
    assert not fused.supported(bench, _stored(device), np.dtype(np.float32), None)  # B is the bench's by default
    both(bench, device, "torch.bfloat16", api)
    finite = np.isfinite(bench)
    both(np.where(finite, bench, 1.0), np.where(finite, device, np.float32(1.0)), "torch.bfloat16", api)


@pytest.mark.parametrize("api", APIS)
def test_an_fp16_output_beside_a_float64_bench_is_read_in_place(api: str) -> None:
    """An fp16 output's storage beside a float64 bench goes to the compiled pass (its values widened to float64
    in registers, msprobe's bench_dev rounded from float64 to fp16 there): every column the oracle's, with benches
    at fp16's rounding ties, subnormals and overflow edge, and non-finite ones."""
    rng = np.random.default_rng(13)
    n = 200_003
    bench = rng.standard_normal(n) * np.exp(rng.uniform(-20, 12, n))
    ties = rng.integers(1, 2047, 1000) * 2.0 ** rng.integers(-24, -10, 1000)  # fp16 subnormal grid and beyond
    bench[1000:2000] = ties + np.where(rng.random(1000) < 0.5, 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -40))
    bench[rng.random(n) < 1e-4] = np.inf
    bench[:6] = [65504.0, 65519.99, 65520.0, 1e-300, -0.0, np.nan]
    with np.errstate(over="ignore", invalid="ignore"):
        device = _device(rng, bench, "torch.float16", 1e-3)
    assert fused.supported(bench, device, np.dtype(np.float16), None)
    both(bench, device, "torch.float16", api)


def _same_stats(got: Any, want: Any, summed: tuple[str, ...]) -> None:
    """Every statistic equal (NaN to NaN), the fields in `summed` (sums in another order) within 1e-6 relative."""
    for name, value in vars(want).items():
        if name in summed and value is not None:
            assert math.isclose(getattr(got, name), value, rel_tol=1e-6, abs_tol=1e-30), name
        else:
            assert _key(getattr(got, name)) == _key(value), name


@pytest.mark.parametrize("held", ["float32", "bf16", "fp16", "float64"])
@pytest.mark.parametrize("ulp", [None, (23, -126, 1.0)])
def test_every_backend_gives_the_statistics_of_numpy(held: str, ulp: tuple[int, int, float] | None) -> None:
    """backends.BACKENDS: the compiled pass and the streamed one give numpy's statistics bit for bit but for the
    float64 sums (their order); torch's takes its pairwise sums in its own order too."""
    import torch

    from pytest_msprobe.metrics import backends
    from pytest_msprobe.metrics.stats import Limits

    rng = np.random.default_rng(7)
    bench = rng.standard_normal(5000).astype(np.float64 if held == "float64" else np.float32)
    bench[:3] = [0.0, 1e-6, -2e-7]  # a zero and small values
    wide = bench * (1 + rng.standard_normal(bench.size) * 1e-3)
    device, dev_dtype = {"float32": (wide.astype(np.float32), np.float32),
                         "bf16": (_stored(torch.from_numpy(wide.astype(np.float32)).bfloat16().float().numpy()), np.float32),
                         "fp16": (wide.astype(np.float16), np.float16),
                         "float64": (wide, np.float64)}[held]
    work, dev_dtype = np.dtype(bench.dtype), np.dtype(dev_dtype)
    limits = Limits(1e-7, 1e-5, 1e-9, 1e-3, (0.01, 0.001, 0.0001), ulp, binary=True)
    assert fused.supported(bench, device, dev_dtype, None, work)
    want = backends.backend("numpy").compute(bench, device, dev_dtype, limits, work)
    float64_sums = ("dot_db", "dot_dd", "dot_bb", "sum_rel_normal")
    for name in ("numba", "streamed"):
        _same_stats(backends.backend(name).compute(bench, device, dev_dtype, limits, work), want, float64_sums)
    if held != "fp16":  # torch holds fp16 as it is: the tensor below is the same values
        values = torch.from_numpy(storage.widen(device).astype(device.dtype if held != "bf16" else np.float32))
        d = values.bfloat16() if held == "bf16" else values
        got = backends.backend("torch").compute(torch.from_numpy(bench), d, dev_dtype, limits, work)
        _same_stats(got, want, float64_sums + ("sum_sq_normal", "pairwise_rel_normal", "sum_ulp"))
    assert list(backends.BACKENDS) == ["numpy", "numba", "torch", "streamed"]
