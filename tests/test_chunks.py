"""Outputs checked in pieces: each piece of a run is bitwise the whole run's, and the metric and strict passes fed
in pieces give the whole passes' statistics and verdicts, bit for bit."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_msprobe.metrics import fused, storage
from pytest_msprobe.metrics.stats import Limits
from pytest_msprobe.metrics.streamed import Streamed as StreamedMetrics
from pytest_msprobe.runs import chunks as C
from pytest_msprobe.runs import tiles
from pytest_msprobe.specs.loader import load_specs, thresholds_for
from pytest_msprobe.verdict import judge, strict
from pytest_msprobe.verdict.strict import streamed as S


def _whole_and_pieces(api: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype,
                      rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    fn = tiles.by_tiles(api, fn)  # as every bench-side run computes it (execution.resolve)
    out = fn(*args, **kwargs)
    chunking = C.plan(api, list(args), dict(kwargs), tuple(out.shape))
    assert chunking is not None, api
    spec = C.RunSpec("bench", fn, chunking, lambda t: dtype if t.is_floating_point() else t.dtype)
    whole = fn(*[a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args], **kwargs).reshape(-1)
    starts, parts = [], []
    for start, piece in C.pieces_of([spec], rows, columns):
        starts.append(start)
        parts.append(piece["bench"])
    assert starts == sorted(starts) and starts[0] == 0 and len(parts) > 1
    return whole, torch.cat(parts)


CASES = [
    ("linear", F.linear, lambda g: (torch.randn(1, 600, 512, generator=g), torch.randn(2500, 512, generator=g) / 20,
                                    torch.randn(2500, generator=g)), {}),
    ("matmul", torch.matmul, lambda g: (torch.randn(3, 200, 96, generator=g), torch.randn(96, 2200, generator=g)), {}),
    ("softmax", F.softmax, lambda g: (torch.randn(4, 70, 257, generator=g) * 4, -1), {}),
    ("log_softmax", F.log_softmax, lambda g: (torch.randn(300, 129, generator=g), -1), {}),
    ("rms_norm", F.rms_norm, lambda g: (torch.randn(2, 150, 257, generator=g), (257,), torch.randn(257, generator=g)),
     {}),
    ("layer_norm", F.layer_norm, lambda g: (torch.randn(300, 96, generator=g), (96,), torch.randn(96, generator=g),
                                            torch.randn(96, generator=g)), {}),
    ("silu", F.silu, lambda g: (torch.randn(4, 90, 33, generator=g),), {}),
    ("add", torch.add, lambda g: (torch.randn(300, 65, generator=g), torch.randn(300, 65, generator=g)), {"alpha": 0.3}),
    ("mul", torch.mul, lambda g: (torch.randn(300, 65, generator=g), torch.randn(65, generator=g)), {}),
    ("addcmul_", torch.Tensor.addcmul_, lambda g: tuple(torch.randn(300, 65, generator=g) for _ in range(3)),
     {"value": -0.01}),
    ("lerp_", torch.Tensor.lerp_, lambda g: (torch.randn(4099, generator=g), torch.randn(4099, generator=g), 0.1), {}),
]


@pytest.mark.parametrize("api,fn,make,kwargs", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("recorded", [torch.bfloat16, torch.float32])
def test_pieces_are_the_whole_run_bitwise(api: str, fn: Any, make: Any, kwargs: dict[str, Any],
                                          recorded: torch.dtype) -> None:
    torch.set_num_threads(1)
    args = tuple(a.to(recorded) if isinstance(a, torch.Tensor) else a for a in make(torch.Generator().manual_seed(3)))
    raised = torch.float32 if recorded == torch.bfloat16 else torch.float64
    for rows, columns in ((64, 64), (128, 10**9), (100, 192)):
        whole, pieces = _whole_and_pieces(api, fn, args, kwargs, raised, rows, columns)
        assert torch.equal(whole, pieces), (api, rows, columns)


def shape_dependent_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """A correct linear whose sums, like some GEMM libraries', take an order set by the shape of the call (MKL's
    fp64 GEMM on an Intel Xeon by its rows and columns together, on an AMD EPYC by its columns): the inner
    dimension in blocks of 8 to 64 products, added block after block."""
    step = 8 << ((w.shape[0] + x.reshape(-1, x.shape[-1]).shape[0]) % 4)
    out = x[..., :step] @ w[:, :step].T
    for k in range(step, x.shape[-1], step):
        out = out + x[..., k:k + step] @ w[:, k:k + step].T
    return out if b is None else out + b


@pytest.mark.parametrize("api", ["linear", "matmul"])
def test_a_contractions_gradients_in_tiles_are_its_gradients_and_each_piece_of_them(api: str) -> None:
    """The bench's gradients of a contraction (tiles._Tiled) equal torch's own to rounding, and each gradient's
    pieces (chunks.plan of its two matrices, tiles.gradient_operands) are its values bitwise, with a library whose
    sums follow the shape of the call."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, tiles.ROWS + 40, 300, dtype=torch.float64, generator=g).requires_grad_()
    shape = (tiles.COLUMNS + 70, 300) if api == "linear" else (300, tiles.COLUMNS + 70)
    w = torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()
    fn = F.linear if api == "linear" else torch.matmul
    out = tiles.by_tiles(api, fn)(x, w)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=g)
    out.backward(grad)
    tiled = [x.grad, w.grad]
    x.grad = w.grad = None
    fn(x, w).backward(grad)
    for mine, torchs in zip(tiled, [x.grad, w.grad]):
        torch.testing.assert_close(mine, torchs, rtol=1e-12, atol=1e-12)
    for position, whole in enumerate(tiled):
        a, b = tiles.gradient_operands(api, position, grad, x.detach(), w.detach())
        chunking = C.plan("matmul", [a, b], {}, (a.shape[0], b.shape[1]))
        assert chunking is not None
        spec = C.RunSpec("bench", tiles.matmul, chunking, lambda t: t.dtype)
        pieces = torch.cat([p["bench"] for _, p in C.pieces_of([spec], tiles.ROWS, tiles.COLUMNS)])
        assert torch.equal(pieces, whole.reshape(-1))


def test_pieces_are_the_whole_run_where_the_library_sums_by_the_shape_of_the_call() -> None:
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(3 * tiles.ROWS + 101, 512, generator=g), torch.randn(2 * tiles.COLUMNS + 3, 512, generator=g)
    chunking = C.plan("linear", [x, w], {}, (x.shape[0], w.shape[0]))
    assert chunking is not None
    for fn, equal in ((tiles.by_tiles("linear", shape_dependent_linear), True), (shape_dependent_linear, False)):
        spec = C.RunSpec("bench", fn, chunking, lambda t: t.dtype)
        for rows, columns in ((64, tiles.COLUMNS), (2 * tiles.ROWS, 10**9)):
            pieces = torch.cat([p["bench"] for _, p in C.pieces_of([spec], rows, columns)])
            assert torch.equal(fn(x, w).reshape(-1), pieces) is equal  # untiled, the pieces' sums are other sums


def test_a_contraction_runs_in_tiles_only_where_it_is_large() -> None:
    calls: list[tuple[int, ...]] = []

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        calls.append((x.shape[0], w.shape[0]))
        return F.linear(x, w, b)

    blocked = tiles.by_tiles("linear", linear)
    r, c = tiles.ROWS, tiles.COLUMNS
    g = torch.Generator().manual_seed(3)  # small integers: every sum exact, in whatever order a library takes
    x, w, b = (torch.randint(-8, 9, shape, generator=g).float() for shape in ((r + 3, 8), (c + 5, 8), (c + 5,)))
    assert torch.equal(blocked(x, w, bias=b), F.linear(x, w, b))
    assert calls == [(r, c), (3, c), (r, 5), (3, 5)]  # tiles of the output: rows within columns
    calls.clear()
    blocked(x[:r], w[:c])
    blocked(x, w.requires_grad_())
    assert calls == [(r, c), (r, c), (3, c), (r, 5), (3, 5)]  # one tile; a gradient taken: in tiles too
    assert blocked(x.reshape(1, r + 3, 8), w.detach()).shape == (1, r + 3, c + 5)  # leading dimensions kept
    empty = torch.zeros(r + 3, 0)  # no inner dimension: the bias alone, in tiles as ever
    assert torch.equal(blocked(empty, w.detach()[:, :0], b), F.linear(empty, w.detach()[:, :0], b))
    assert blocked(x[:0], w.detach()).shape == (0, c + 5)  # no rows: one call
    assert tiles.by_tiles("softmax", F.softmax) is F.softmax
    assert [tiles.aligned(n) for n in (1, tiles.COLUMNS, tiles.COLUMNS + 1)] == [tiles.COLUMNS, tiles.COLUMNS,
                                                                                  2 * tiles.COLUMNS]
def test_blocks_are_multiples_of_the_row_multiple_and_no_tail_is_short() -> None:
    m = C.ROW_MULTIPLE
    assert C.blocks(4 * m + 3, 2 * m) == [(0, 2 * m), (2 * m, 4 * m + 3)]  # the 3-row tail joins the last block
    assert C.blocks(5 * m, 10) == [(i * m, (i + 1) * m) for i in range(5)]  # never under one multiple
    assert C.blocks(3 * m, 10**9) == [(0, 3 * m)]


def test_calls_whose_rows_are_not_independent_do_not_split() -> None:
    x = torch.randn(300, 64)
    assert C.plan("softmax", [x, 0], {}, (300, 64)) is None  # normalised along the split dimension
    assert C.plan("sum", [x], {}, ()) is None  # not a covered API
    assert C.plan("add", [x, torch.randn(300, 1)], {}, (300, 64)) is None  # broadcast along the rows' other axis
    assert C.plan("matmul", [x, torch.randn(2, 64, 8)], {}, (2, 300, 8)) is None  # batched second operand
    assert C.plan("linear", [torch.randn(10, 64), torch.randn(8, 64)], {}, (10, 8)) is None  # too few rows


def _bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(storage.BITS)


def _outputs(dtype: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b = rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))
    if dtype == "torch.bfloat16":
        b = b.astype(np.float32)
        noise = rng.standard_normal((2, n)).astype(np.float32) * 3e-3
        return b, _bits(b * (1 + noise[0])), _bits(b * (1 + noise[1]))
    noise = rng.standard_normal((2, n)) * 1e-7
    return b, (b * (1 + noise[0])).astype(np.float32), (b * (1 + noise[1])).astype(np.float32)


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float32"])
def test_metric_pass_in_pieces_is_the_whole_pass(dtype: str) -> None:
    rng = np.random.default_rng(1)
    n = 100_003
    b, d, _ = _outputs(dtype, n, rng)
    work = np.dtype(np.float32 if dtype == "torch.bfloat16" else np.float64)
    mantissa = 7 if dtype == "torch.bfloat16" else 23
    limits = Limits(1e-6, 1e-3, 1e-5, 1e-3, (0.01, 0.001, 0.0001), (mantissa, -126, 1.0))
    whole = fused.compute(b, d, np.dtype(np.float32), limits, work)
    streamed = StreamedMetrics(d, np.dtype(np.float32), limits, work)
    while streamed.done() < n:
        start = streamed.done()
        streamed.feed(start, b[start:min(n, start + int(rng.integers(1, 20_000)))])
    stats, bench_worst = streamed.finish()
    assert dataclasses.asdict(stats) == dataclasses.asdict(whole)
    assert bench_worst == b[whole.worst]


@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float32"])
@pytest.mark.parametrize("kind", ["contraction", "reduction", "elementwise", "exact"])
def test_strict_pass_in_pieces_is_the_whole_pass(dtype: str, kind: str) -> None:
    rng = np.random.default_rng(2)
    rows, width = 300, 257
    n = rows * width
    b, d, t = _outputs(dtype, n, rng)
    magnitude = np.abs(b).astype(np.float32) * 3 if kind == "contraction" else None
    torch_run = None if kind == "contraction" else t
    rules = judge.element_rules(thresholds_for(load_specs(), "linear")["strict"], dtype, kind)
    whole = strict.strict_compare(b, d, dtype, rules, strict.Runs(kind=kind, torch_run=torch_run, magnitude=magnitude, row=width))
    squares = S.Squares()
    for start in range(0, n, 7_001):
        squares.feed(b[start:start + 7_001])
    streamed = S.Streamed(d, dtype, rules, S.Cut(kind, width),
                          S.floor(squares.finish(), n, b.dtype.itemsize, rules, kind), torch_run is not None)
    while streamed.done() < n:
        start = streamed.done()
        end = min(n, start + int(rng.integers(1, 60_000)))
        pieces = {"b": b[start:end]}
        if torch_run is not None:
            pieces["t"] = torch_run[start:end]
        if magnitude is not None:
            pieces["mag"] = magnitude[start:end]
        streamed.feed(start, pieces)
    got = streamed.finish()
    assert got is not None
    assert (got.status, got.message, got.stats) == (whole.status, whole.message, whole.stats)


def test_sum_of_squares_in_pieces_is_einsums() -> None:
    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float64):
        b = (rng.standard_normal(1_000_003) * 1e3).astype(dtype)
        squares = S.Squares()
        for start in range(0, b.size, 12_345):
            squares.feed(b[start:start + 12_345])
        assert squares.finish() == float(np.einsum("i,i->", b, b, dtype=np.float64))
