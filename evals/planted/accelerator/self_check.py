"""Correct kernels that compute as CUDA's do: correct by their vendor's contract, unlike torch's CPU kernels.

    python -m evals accelerator --self-check

Why: the planted variants of `arms.py` are sound kernels, but mostly ones a CPU could run. A GPU's kernels
differ in documented ways (`../shared/NOTES-accuracy-contracts.md`): maths functions within the CUDA Math
API's ULP bounds rather than correctly rounded, fp32 sums accumulated in fp32 (CPU: double) in a tree,
broadcast and embedding gradients summed in another order, fused multiply-adds, ties and duplicate
writers resolved another way, decompositions with other signs, and dtypes with no kernel at all. Each arm
here is one of those, deterministic (every perturbation is a hash of the input's bits, as a real function
of its input), and a checker must pass it; `not-implemented` must come out as a skip.

`--self-check` measures every arm against fp64 (max ULP error and mean signed bias per function) and
asserts it keeps its contract; tie, duplicate and sign variants are checked for validity.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F

from evals.planted.accelerator import ACCELERATOR_ARMS
from evals.planted.accelerator.fma import fma32
from evals.planted.accelerator.gradients import ROWS_PER_CHUNK
from evals.planted.accelerator.numerics import (
    F32,
    SIXTEEN,
    ULPS,
    as_f32,
    cuda_math,
    ulp32,
)
from evals.planted.accelerator.sums import SCAN_BLOCK, THREADS
from evals.planted.arm import Arm
from evals.planted.mode import armed_mode


def _ulps(out: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Signed error of `out` from the fp64 `exact`, in fp32 ULPs of `exact`; finite elements only."""
    keep = torch.isfinite(exact) & torch.isfinite(out.double())
    return ((out.double() - exact) / ulp32(exact))[keep]


def _row(name: str, dtype: str, err: torch.Tensor, bound: float | None, away: torch.Tensor | None = None) -> None:
    bias = (err * away).mean() if away is not None else err.mean()
    worst = float(err.abs().max())
    print(f"| {name} | {dtype} | {err.numel()} | {worst:.3f} | {float(bias):+.4f} | {bound if bound else '-'} |")
    if bound is not None:
        assert worst <= bound, f"{name} {dtype}: {worst} ULP over {bound}"


def _armed(arm: Arm, fn: Callable[..., Any], *args: Any, dtype: torch.dtype = F32) -> Any:
    """fn(*args) with the arm armed as the plugin arms it, for calls of `dtype`."""
    with armed_mode(arm, dtype):
        return fn(*args)


def self_check() -> None:
    """Every arm against fp64 on random inputs: within its contract, and different from torch's CPU kernel."""
    arms = {a.name: a for a in ACCELERATOR_ARMS}
    gen = torch.Generator().manual_seed(0)
    n = 200_000

    def uniform(lo: float, hi: float, size: int = n) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(size, generator=gen, dtype=torch.float64)

    print("| function | dtype | elements | max ULP | mean signed bias (ULP) | bound |\n|---|---|---|---|---|---|")
    inputs = {"sin": uniform(-100, 100), "cos": uniform(-100, 100), "exp": uniform(-80, 80),
              "log": torch.exp(uniform(-80, 80)), "tanh": uniform(-10, 10), "rsqrt": torch.exp(uniform(-40, 40)),
              "erf": uniform(-4, 4), "lgamma": torch.cat([uniform(-10.001, -2.264)[:0], uniform(0.01, 40),
                                                          uniform(-40, -10.001)]),
              "erfinv": uniform(-0.999, 0.999)}
    for name, x64 in inputs.items():
        fn, _, _, away, bound = ULPS[name]
        x = x64.float()
        arm = arms["cuda-sincos" if name in ("sin", "cos") else "cuda-math"]
        out = _armed(arm, getattr(torch, name), x)
        exact = fn(x.double())
        changed = (out != getattr(torch, name)(x)).double().mean()
        assert changed > 0.1, f"{name}: changes only {changed:.1%} of torch's results"
        _row(name, "fp32", _ulps(out, exact), bound, torch.sign(exact)[torch.isfinite(exact)] if away else None)
        for low in SIXTEEN:  # the fp32 result rounded once: within half a 16-bit ULP plus fp32's error
            xl = x.to(low)
            ol = _armed(arm, getattr(torch, name), xl, dtype=low).double()
            ex = fn(xl.double())
            mant = 10 if low == torch.float16 else 7
            keep = torch.isfinite(ex) & torch.isfinite(ol) & (ex.abs() > 2.0 ** -14)
            rel = ((ol - ex) / (ulp32(ex) * 2.0 ** (23 - mant)))[keep]
            assert rel.abs().max() <= 0.5 + bound * 2.0 ** (mant - 23) + 1e-9, (name, low, float(rel.abs().max()))
    # pow: the general powf path (a specialised exponent is a product, sqrt or rsqrt)
    base, expo = torch.exp(uniform(-5, 5)).float(), uniform(-3, 3).float()
    out = _armed(arms["cuda-math"], lambda: torch.pow(base, expo))
    _row("pow", "fp32", _ulps(out, torch.pow(base.double(), expo.double())), ULPS["pow"][4])
    out = _armed(arms["cuda-math"], lambda: torch.pow(base, 3))
    _row("pow(x, 3) = x*x*x", "fp32", _ulps(out, base.double() ** 3), 1.5)
    # composites: no documented bound of their own; measured, and kept well inside a few ULP where nothing
    # cancels (gelu's 1 + erf(x / sqrt(2)) below x = -1 cancels, for torch's CPU kernel as for CUDA's)
    x = uniform(-5, 10).float()
    call: Callable[..., Any] | None  # the composites' calls here, the softmax and not-implemented ones below
    for name, call, xs, limit in (("sigmoid", torch.sigmoid, x, 6), ("silu", F.silu, x, 6),
                                  ("gelu (x > -1)", F.gelu, x[x > -1], 6), ("gelu (x <= -1)", F.gelu, x[x <= -1], None),
                                  ("gelu (x <= -1), torch's CPU kernel", None, x[x <= -1], None)):
        out = F.gelu(xs) if call is None else _armed(arms["cuda-math"], call, xs)
        _row(name, "fp32", _ulps(out, F.gelu(xs.double()) if "gelu" in name else
                                 getattr(F, name)(xs.double()) if name == "silu" else torch.sigmoid(xs.double())), limit)
    # backward: sin's gradient is g * CUDA's cos; rsqrt's is -0.5 * g * y^3 from its own y (4-6 ULP on an H100)
    x = uniform(-100, 100, 50_000).float().requires_grad_()
    _armed(arms["cuda-sincos"], lambda: torch.sin(x)).backward(torch.ones_like(x))
    assert torch.equal(cast(torch.Tensor, x.grad), cuda_math("cos", x.detach())), "sin's gradient is not CUDA's cos"
    v = torch.exp(uniform(-20, 20, 50_000)).float().requires_grad_()
    _armed(arms["cuda-math"], lambda: torch.rsqrt(v)).backward(torch.ones_like(v))
    _row("rsqrt backward", "fp32", _ulps(cast(torch.Tensor, v.grad), -0.5 * v.detach().double() ** -1.5), 8)

    print("\n| reduction | dtype | shape | max error / Higham bound | changed vs torch |\n|---|---|---|---|---|")
    u = 2.0 ** -24

    def gamma(k: float) -> float:
        return k * u / (1 - k * u)

    for shape, dim in (((64, 5000), 1), ((3000, 32), 0), ((7, 300_001), 1)):
        x = torch.randn(shape, generator=gen, dtype=torch.float64).float()
        steps = -(-x.shape[dim] // THREADS) + math.ceil(math.log2(min(THREADS, x.shape[dim])))
        out = _armed(arms["cuda-reductions"], torch.sum, x, dim)
        err = (out.double() - x.double().sum(dim)).abs() / (gamma(steps) * x.double().abs().sum(dim))
        changed = (out != x.sum(dim)).double().mean()
        print(f"| sum | fp32 | {tuple(shape)} dim {dim} | {float(err.max()):.3f} | {changed:.1%} |")
        assert err.max() <= 1, "sum over its bound"
        out = _armed(arms["cuda-reductions"], torch.mean, x, dim)
        err = (out.double() - x.double().mean(dim)).abs() / \
            (gamma(steps + 2) * x.double().abs().sum(dim) / x.shape[dim] + ulp32(out.double()))
        print(f"| mean | fp32 | {tuple(shape)} dim {dim} | {float(err.max()):.3f} | "
              f"{(out != x.mean(dim)).double().mean():.1%} |")
        assert err.max() <= 1, "mean over its bound"
    x = torch.randn(16, 3000, generator=gen, dtype=torch.float64).float()
    out = _armed(arms["cuda-reductions"], lambda: torch.cumsum(x, 1))
    k = torch.arange(1, 3001, dtype=torch.float64)
    depth = math.log2(SCAN_BLOCK) + torch.ceil(k / SCAN_BLOCK)
    scan_bound = depth * u / (1 - depth * u) * x.double().abs().cumsum(1)
    err = (out.double() - x.double().cumsum(1)).abs() / scan_bound
    print(f"| cumsum | fp32 | (16, 3000) dim 1 | {float(err.max()):.3f} | "
          f"{(out != torch.cumsum(x, 1)).double().mean():.1%} |")
    assert err.max() <= 1, "cumsum over its bound"
    x = (3 * torch.randn(64, 2048, generator=gen, dtype=torch.float64)).float()
    shift = (x.double() - x.double().amax(-1, keepdim=True)).abs()  # x - max rounds: exp's argument is off by it
    for name, call, allowed in (
            ("softmax: error / ((|x - max| + 6) u |y|)", lambda t: torch.softmax(t, -1),
             lambda ref: (shift + 6) * u * ref.abs()),
            ("log_softmax: error / ((2 |x - max| + 10) u)", lambda t: F.log_softmax(t, -1),
             lambda ref: (2 * shift + 10) * u),
            ("logsumexp: error / 8 ULP", lambda t: torch.logsumexp(t, -1), lambda ref: 8 * ulp32(ref))):
        out = _armed(arms["cuda-reductions"], call, x)
        ref = call(x.double())
        err = float(((out.double() - ref).abs() / allowed(ref)).max())
        print(f"| {name} | fp32 | (64, 2048) | {err:.3f} | {(out != call(x)).double().mean():.1%} |")
        assert err <= 1, name
    x = torch.randn(64, 1024, generator=gen, dtype=torch.float64).float()
    w, b = torch.randn(1024, generator=gen).float(), torch.randn(1024, generator=gen).float()
    out = _armed(arms["cuda-reductions"], F.layer_norm, x, (1024,), w, b)
    ref = F.layer_norm(x.double(), (1024,), w.double(), b.double())
    scale = (F.layer_norm(x.double(), (1024,)) * w.double()).abs() + b.double().abs() + w.double().abs()
    err = (out.double() - ref).abs() / (scale * u)  # |w|: the mean's error, relative to x rather than x - mean
    print(f"| layer_norm: error / ((|x_hat w| + |b| + |w|) u) | fp32 | (64, 1024) | {float(err.max()):.3f} (bound 8) | "
          f"{(out != F.layer_norm(x, (1024,), w, b)).double().mean():.1%} |")
    assert err.max() <= 8, "layer_norm"
    x = torch.randn(8, 32, 64, generator=gen, dtype=torch.float64).float()
    w, b = torch.randn(32, generator=gen).float(), torch.randn(32, generator=gen).float()
    out = _armed(arms["cuda-reductions"], F.group_norm, x, 4, w, b)
    ref = F.group_norm(x.double(), 4, w.double(), b.double())
    scale = (F.group_norm(x.double(), 4) * w.double()[:, None]).abs() + b.double().abs()[:, None] + \
        w.double().abs()[:, None]
    err = (out.double() - ref).abs() / (scale * u)
    print(f"| group_norm: error / ((|x_hat w| + |b| + |w|) u) | fp32 | (8, 32, 64), 4 groups | {float(err.max()):.3f} "
          f"(bound 8) | {(out != F.group_norm(x, 4, w, b)).double().mean():.1%} |")
    assert err.max() <= 8, "group_norm"
    x, w = torch.randn(4, 32, 40, generator=gen).float(), torch.randn(32, 16, 5, generator=gen).float()
    out = _armed(arms["cuda-contractions"], F.conv_transpose1d, x, w)
    terms = F.conv_transpose1d(x.double().abs(), w.double().abs())
    err = (out.double() - F.conv_transpose1d(x.double(), w.double())).abs() / (gamma(32 * 5) * terms)
    print(f"| conv_transpose1d in channel chunks: error / Higham bound | fp32 | (4, 32, 40) * (32, 16, 5) | "
          f"{float(err.max()):.3f} | {(out != F.conv_transpose1d(x, w)).double().mean():.1%} |")
    assert err.max() <= 1, "conv_transpose1d"
    for dtype in SIXTEEN:  # 16-bit: fp32 accumulation rounded once: within a 16-bit ULP
        xl = torch.randn(32, 4000, generator=gen).to(dtype)
        out = _armed(arms["cuda-reductions"], torch.sum, xl, 1, dtype=dtype)
        assert ((out.double() - xl.double().sum(1)).abs() <= out.double().abs() * 2.0 ** -7 + 1e-3).all(), dtype

    print("\n| check | result |\n|---|---|")
    # broadcast gradient: forward bitwise torch's; the operand's gradient within the sum's bound
    a = torch.randn(1, 512, 1, generator=gen).requires_grad_()
    h = torch.randn(4, 512, 1000, generator=gen)
    y = _armed(arms["cuda-broadcast-grad"], lambda: h * a)
    assert torch.equal(y, h * a.detach())
    g = torch.randn(y.shape, generator=gen)
    y.backward(g)
    exact = (g.double() * h.double()).sum((0, 2), keepdim=True)
    steps = -(-4000 // THREADS) + 9
    err = (cast(torch.Tensor, a.grad).double() - exact).abs() / (gamma(steps + 1) * (g.double() * h.double()).abs().sum((0, 2), True))
    plain = (g * h).sum((0, 2), keepdim=True)
    print(f"| broadcast mul grad (1, 512, 1) over (4, 512, 1000): error / bound | {float(err.max()):.3f}, "
          f"{(cast(torch.Tensor, a.grad) != plain).double().mean():.0%} differ from torch's |")
    assert err.max() <= 1
    # embedding backward: every id's gradient within the bound of its segment's sum, rounded to the weight's dtype
    for dtype in (F32, torch.bfloat16):
        weight = torch.randn(50, 64, generator=gen).to(dtype).requires_grad_()
        idx = torch.randint(0, 50, (8, 512), generator=gen)
        out = _armed(arms["cuda-embedding-backward"], F.embedding, idx, weight, 3, dtype=dtype)
        g = torch.randn(out.shape, generator=gen).to(dtype)
        out.backward(g)
        exact = torch.zeros(50, 64, dtype=torch.float64).index_add_(0, idx.reshape(-1), g.double().reshape(-1, 64))
        exact[3] = 0
        mag = torch.zeros(50, 64, dtype=torch.float64).index_add_(0, idx.reshape(-1), g.double().abs().reshape(-1, 64))
        tol = gamma(ROWS_PER_CHUNK + 4096 // ROWS_PER_CHUNK) * mag + (exact.abs() * 2.0 ** -8 if dtype != F32 else 0)
        err = ((cast(torch.Tensor, weight.grad).double() - exact).abs() - tol).max()
        plain = weight.detach().clone().requires_grad_()
        F.embedding(idx, plain, 3).backward(g)  # type: ignore[no-untyped-call]  # unannotated in torch
        print(f"| embedding backward {str(dtype)[6:]}: over its bound by | {float(err):.2e} (<= 0), "
              f"{(cast(torch.Tensor, weight.grad) != cast(torch.Tensor, plain.grad)).double().mean():.1%} differ from torch's |")
        assert err <= 1e-12
    # FMA: exactly one rounding of value * (t1 / t2) + self, checked with rationals on a sample
    from fractions import Fraction

    x, t1, t2 = (torch.randn(20_000, generator=gen) for _ in range(3))
    out = _armed(arms["cuda-fma-optimizer"], lambda: x.clone().addcdiv_(t1, t2, value=-1e-3))
    q = t1 / t2
    v32 = float(as_f32(-1e-3))
    wrong = 0
    for i in range(0, 20_000, 7):
        exact_q = Fraction(float(x[i])) + Fraction(v32) * Fraction(float(q[i]))
        r = float(out[i])
        below, above = float(torch.nextafter(out[i], torch.tensor(-math.inf))), \
            float(torch.nextafter(out[i], torch.tensor(math.inf)))
        wrong += abs(Fraction(r) - exact_q) > min(abs(Fraction(below) - exact_q), abs(Fraction(above) - exact_q))
    changed = (out != x.clone().addcdiv_(t1, t2, value=-1e-3)).double().mean()
    print(f"| addcdiv_ fp32 as fmaf(value, t1 / t2, self): not the nearest fp32 | {wrong} of 2,858; "
          f"{changed:.1%} differ from torch's |")
    assert wrong == 0
    # a tie of the fp64 sum (2^36 + 3 * 2^12 - 2^-34): rounding it twice would give 2^36 + 2^14
    a32, b32, c32 = as_f32(4096 * (1 + 2.0 ** -23)), as_f32(1 - 2.0 ** -23), as_f32(2.0 ** 36 + 2.0 ** 13)
    assert float(fma32(a32, b32, c32)) == 2.0 ** 36 + 2.0 ** 13 != float((a32.double() * b32 + c32).float())
    # ties and duplicates: valid results, different from torch's
    x = torch.randint(0, 5, (8, 100), generator=gen).float()
    v, i = _armed(arms["ties-and-duplicates"], lambda: torch.sort(x, dim=1))
    assert torch.equal(v, torch.sort(x, dim=1).values) and torch.equal(x.gather(1, i), v)
    assert torch.equal(i.sort(1).values, torch.arange(100).expand(8, 100))
    print(f"| sort with ties: values torch's, indices a permutation | {(i != torch.sort(x, 1).indices).double().mean():.0%}"
          " of indices differ |")
    v, i = _armed(arms["ties-and-duplicates"], lambda: torch.topk(x, 10, dim=1))
    assert torch.equal(v, torch.topk(x, 10, dim=1).values) and torch.equal(x.gather(1, i), v)
    src = torch.randn(8, 100, generator=gen)
    idx = torch.randint(0, 10, (8, 100), generator=gen)
    out = _armed(arms["ties-and-duplicates"], lambda: torch.zeros(8, 10).scatter(1, idx, src))
    ok = all(float(out[r, c]) in {float(src[r, j]) for j in range(100) if idx[r, j] == c} or
             (float(out[r, c]) == 0 and not (idx[r] == c).any()) for r in range(8) for c in range(10))
    assert ok, "scatter wrote a value no writer had"
    print(f"| scatter with duplicates: every element one writer's | "
          f"{(out != torch.zeros(8, 10).scatter(1, idx, src)).double().mean():.0%} differ |")
    a = torch.randn(3, 40, 30, generator=gen)
    q, r = _armed(arms["ties-and-duplicates"], lambda: torch.linalg.qr(a))
    assert torch.allclose(q @ r, a, atol=1e-5) and torch.allclose(q.mT @ q, torch.eye(30), atol=1e-5)
    u_, s_, vh = _armed(arms["ties-and-duplicates"], lambda: torch.linalg.svd(a, full_matrices=False))
    assert torch.allclose(u_ * s_[..., None, :] @ vh, a, atol=1e-4)
    print("| qr and svd with flipped signs: Q R = A, Q^T Q = I, U S V^H = A | yes |")
    # not implemented
    for call, dtype, kind in ((lambda: torch.angle(torch.ones(3, dtype=torch.bfloat16)), torch.bfloat16, RuntimeError),
                              (lambda: torch.histc(torch.ones(3, dtype=torch.float16)), torch.float16, RuntimeError),
                              (lambda: torch.histogram(torch.ones(3), 4), F32, NotImplementedError)):
        try:
            _armed(arms["not-implemented"], call, dtype=dtype)
        except kind as exc:
            assert "not implemented" in str(exc) or "Could not run" in str(exc)
        else:
            raise AssertionError("no error raised")
    assert torch.equal(_armed(arms["not-implemented"], lambda: torch.angle(torch.ones(3))), torch.zeros(3))
    print("| not-implemented: RuntimeError for 16-bit angle/histc/igamma, NotImplementedError for histogram | yes |")
    print("\nself-check passed")


def main() -> None:
    if sys.argv[1:] != ["--self-check"]:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    self_check()


if __name__ == "__main__":
    main()
