"""A bf16 output's 16-bit storage (metrics/storage.py): one value per element, whoever reads it: numpy's
`widen` (the oracles, the careful paths), the compiled passes' `value`, and torch's own bf16 -> float32; and the
checks take the storage of a host tensor without a copy."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pytest_msprobe.check import compare
from pytest_msprobe.metrics import storage
from pytest_msprobe.verdict.strict import numba_kernel as strict_kernel


def every_bf16() -> torch.Tensor:
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_every_bf16_bit_pattern_has_one_value() -> None:
    """All 65,536 patterns (signed zeros, subnormals, inf, every NaN): numpy's, the compiled pass's and torch's
    float32 values have the same bits."""
    tensor = every_bf16()
    kind, bits, dtype = compare.stored(tensor)
    assert (kind, dtype, bits.dtype) == ("tensor", "torch.bfloat16", storage.BITS) and storage.is_bits(bits)
    expected = tensor.float().numpy().view(np.uint32)
    assert (storage.widen(bits).view(np.uint32) == expected).all()
    compiled = np.empty(bits.size, np.float32)
    strict_kernel._load(bits, compiled, bits.size)  # the pass's load: pairwise.value on each element
    assert (compiled.view(np.uint32) == expected).all()


def test_the_checks_read_a_bf16_tensor_in_place() -> None:
    tensor = torch.randn(64, 33).bfloat16()
    bits = compare.stored(tensor)[1]
    assert bits.shape == (64, 33) and np.shares_memory(bits, tensor.view(torch.int16).numpy())
    column = compare.stored(tensor[:, 1])[1]  # a strided view: still its storage, not a copy
    assert np.shares_memory(column, bits) and (storage.widen(column) == tensor[:, 1].float().numpy()).all()
    assert compare.stored(tensor.float())[1].dtype == np.float32  # other dtypes as to_numpy gives them
    assert compare.to_numpy(tensor)[1].dtype == np.float32  # to_numpy's other callers still get values


def test_widen_leaves_other_arrays_and_keeps_0_d_arrays() -> None:
    floats = np.linspace(-1, 1, 5, dtype=np.float32)
    assert storage.widen(floats) is floats and not storage.is_bits(floats)
    zero_d = compare.stored(torch.tensor(1.5, dtype=torch.bfloat16))[1]
    assert zero_d.shape == () and isinstance(storage.widen(zero_d), np.ndarray) and float(storage.widen(zero_d)) == 1.5


def test_the_mindspore_standard_judges_a_bf16_output_by_its_values() -> None:
    """`--msprobe-standard mindspore` reads the same StrictArrays as strict: the storage of a bf16 output gives
    the verdict and metrics its values give."""
    from pytest_msprobe.specs.loader import load_specs
    from pytest_msprobe.verdict import judge, standards

    specs = load_specs()
    bench = torch.linspace(-3, 3, 4096, dtype=torch.float64).sin()
    device = (bench * 1.01).bfloat16()
    rows = []
    for held in (compare.stored(device)[1], device.float().numpy()):
        row = standards.compare_tensor("x", bench.numpy(), held, bench_dtype="torch.float64",
                                       device_dtype="torch.bfloat16", judging=standards.Judging("sin", specs))
        judge.decide(row, "mindspore", api_name="sin", specs=specs,
                     evidence=judge.Evidence(arrays=judge.StrictArrays(bench.numpy(), held)))
        rows.append((row.status, row.message, row.verdict, row.verdict_message, row.metrics))
    assert rows[0] == rows[1] and rows[0][2] == "error"  # 1 % off: msprobe's MindSpore rule fails it



def test_integer_uint16_outputs_are_not_taken_for_bf16_storage() -> None:
    """Only a bf16 output's uint16 array is storage: a torch.uint16 output keeps msprobe's row for its dtype (not
    comparable), not a float comparison of the integers."""
    from pytest_msprobe.verdict import standards

    values = np.arange(1000, dtype=np.uint16)
    row = standards.compare_tensor("x", values, values.copy(), bench_dtype="torch.uint16",
                                   device_dtype="torch.uint16", judging=standards.Judging("add"))
    assert (row.status, row.message) == ("error", "Bench out dtype is uint16 but npu output dtype is uint16, cannot "
                                                  "compare.")


def every_fp16() -> torch.Tensor:
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)


def test_every_fp16_bit_pattern_has_one_value() -> None:
    """All 65,536 fp16 patterns (signed zeros, every subnormal, inf, every NaN): the compiled passes' widening of
    the storage (int16) has numpy's float16 -> float32 bits, and torch's value (torch quiets signalling NaNs:
    those are NaN in both)."""
    tensor = every_fp16()
    kind, held, dtype = compare.stored(tensor)
    assert (kind, dtype, held.dtype) == ("tensor", "torch.float16", np.float16) and not storage.is_bits(held)
    view = storage.kernel_view(held)
    assert view.dtype == storage.HALF and np.shares_memory(view, held)
    expected = held.astype(np.float32)
    compiled = np.empty(view.size, np.float32)
    strict_kernel._load(view, compiled, view.size)  # the pass's load: pairwise.value on each element
    assert (compiled.view(np.uint32) == expected.view(np.uint32)).all()
    by_torch = tensor.float().numpy()
    nan = np.isnan(by_torch)
    assert nan.sum() == 2046 and (np.isnan(compiled) == nan).all()
    assert (compiled[~nan].view(np.uint32) == by_torch[~nan].view(np.uint32)).all()
    subnormal = (np.abs(expected) < 2.0 ** -14) & (expected != 0)
    assert subnormal.sum() == 2 * 1023 and (compiled[subnormal] != 0).all()  # none flushed to zero


def test_the_checks_read_an_fp16_tensor_in_place() -> None:
    tensor = torch.randn(64, 33).half()
    held = compare.stored(tensor)[1]
    assert np.shares_memory(held, tensor.numpy()) and np.shares_memory(storage.kernel_view(held), held)
    floats = np.linspace(-1, 1, 5, dtype=np.float32)
    assert storage.kernel_view(floats) is floats and storage.kernel_view(held.view(np.uint16)).dtype == np.uint16


def test_fp16_outputs_reach_both_compiled_passes_as_their_storage(monkeypatch: Any) -> None:
    """msprobe's metric pass and the strict pass get an fp16 output (and its torch run) as int16 storage, not a
    float32 copy; the results are those of the numpy paths."""
    from pytest_msprobe.metrics import fused, numba_kernel
    from pytest_msprobe.specs.loader import load_specs, thresholds_for
    from pytest_msprobe.verdict import judge, standards

    seen: list[str] = []
    for module, name in ((numba_kernel, "metrics_chunks"), (strict_kernel, "strict_blocks")):
        original = getattr(module, name)

        def spy(*args: Any, _original: Any = original, _name: str = name) -> Any:
            seen.append(f"{_name} {args[1].dtype}")
            return _original(*args)

        monkeypatch.setattr(module, name, spy)
    specs = load_specs()
    bench = np.linspace(-3, 3, 70_000, dtype=np.float32) ** 3
    device = (bench * np.float32(1.0005)).astype(np.float16)
    device[:3] = [np.inf, np.float16(2.0 ** -20), 0]  # an inf, a subnormal, a zero
    row = standards.compare_tensor("x", bench, device, bench_dtype="torch.float32", device_dtype="torch.float16",
                                   judging=standards.Judging("mul", specs))
    torch_run = (bench * np.float32(0.9995)).astype(np.float16)
    verdict = judge.strict_verdict(judge.StrictArrays(bench, device, torch_run=torch_run), "torch.float16",
                                   thresholds_for(specs, "mul"))
    assert set(seen) == {"metrics_chunks int16", "strict_blocks int16"}  # every call, each pass
    monkeypatch.setattr(fused, "supported", lambda *a, **k: False)
    slow = standards.compare_tensor("x", bench, device, bench_dtype="torch.float32", device_dtype="torch.float16",
                                    judging=standards.Judging("mul", specs))
    assert (row.status, row.message, row.worst) == (slow.status, slow.message, slow.worst)
    # the strict pass's float32 path (fp16 values widened by numpy before the call, as before) gives the same
    wide = judge.strict_verdict(judge.StrictArrays(bench, device.astype(np.float32),
                                                   torch_run=torch_run.astype(np.float32)),
                                "torch.float16", thresholds_for(specs, "mul"))
    assert (verdict.status, verdict.message) == (wide.status, wide.message) and verdict.status == "error"
    assert verdict.stats.keys() == wide.stats.keys()
    assert all(a == b or (np.isnan(a) and np.isnan(b)) for a, b in zip(verdict.stats.values(), wide.stats.values()))


def test_the_metric_pass_rounds_a_bench_to_fp16_as_numpy_does() -> None:
    """msprobe's bench_dev of an fp16 output, rounded in the pass (pairwise.half_rounded), has numpy's float32 ->
    float16 -> float32 bits (NaN: NaN) on float32 patterns across the whole range (every 997th, and every pattern
    around fp16's subnormal, normal and overflow boundaries and their ties). The whole 2**32 was checked once."""
    from numba import njit

    from pytest_msprobe.metrics.pairwise import half_rounded

    @njit(cache=False)
    def rounded(values: np.ndarray, out: np.ndarray) -> None:
        for j in range(values.size):
            out[j] = half_rounded(values[j])

    edges = np.array([2.0 ** -25, 2.0 ** -24, 2.0 ** -15, 2.0 ** -14, 1.0, 2048.0, 65504.0, 65520.0, np.inf],
                     dtype=np.float32).view(np.uint32).astype(np.int64)
    around = (edges[:, None] + np.arange(-5000, 5000)[None, :]).reshape(-1)
    bits = np.concatenate([np.arange(0, 1 << 32, 997, dtype=np.int64), around, around | (1 << 31)])
    values = bits.astype(np.uint32).view(np.float32)
    out = np.empty_like(values)
    rounded(values, out)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = values.astype(np.float16).astype(np.float32)
    nan = np.isnan(expected)
    assert (np.isnan(out) == nan).all() and (out[~nan].view(np.uint32) == expected[~nan].view(np.uint32)).all()


def test_the_metric_pass_rounds_a_float64_bench_to_fp16_as_numpy_does() -> None:
    """A float64 bench of an fp16 output is rounded to fp16 from float64 itself (numpy's cast, never through
    float32, which rounds twice at some ties): numpy's float64 -> float16 -> float64 bits on patterns across
    fp16's range and around its subnormal, normal and overflow boundaries, ties and near-ties."""
    from numba import njit

    from pytest_msprobe.metrics.pairwise import half_rounded

    @njit(cache=False)
    def rounded(values: np.ndarray, out: np.ndarray) -> None:
        for j in range(values.size):
            out[j] = half_rounded(values[j])

    rng = np.random.default_rng(5)
    grid = rng.integers(0, 0x7C00, 200_000).astype(np.uint16).view(np.float16)  # every finite fp16 >= 0
    with np.errstate(over="ignore"):  # 65504's spacing is inf in fp16
        step = np.spacing(grid).astype(np.float64)
    step[grid == np.float16(65504.0)] = 32.0
    grid = grid.astype(np.float64)
    ties = np.concatenate([grid + step / 2, grid + step / 2 * (1 + 2.0 ** -40), grid + step / 2 * (1 - 2.0 ** -40)])
    edges = np.array([2.0 ** -25, 2.0 ** -24, 2.0 ** -15, 2.0 ** -14, 1.0, 2048.0, 65504.0, 65520.0, np.inf])
    around = (edges.view(np.int64)[:, None] + np.arange(-3000, 3000)[None, :]).reshape(-1).view(np.float64)
    spread = rng.standard_normal(200_000) * np.exp(rng.uniform(-40, 15, 200_000))
    values = np.concatenate([ties, around, spread, [np.nan, 1e300, 1e-300]])
    values = np.concatenate([values, -values])
    out = np.empty_like(values)
    rounded(values, out)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = values.astype(np.float16).astype(np.float64)
        through32 = values.astype(np.float32).astype(np.float16).astype(np.float64)
    nan = np.isnan(expected)
    assert (np.isnan(out) == nan).all() and (out[~nan].view(np.uint64) == expected[~nan].view(np.uint64)).all()
    assert (through32[~nan] != expected[~nan]).any()  # the double rounding the cast from float64 avoids
