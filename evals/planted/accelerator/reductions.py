"""cuda-reductions: CUDA's AccumulateType: fp32 sums accumulated in fp32 (CPU: double) in a tree, tree
scans, and the softmax and norms whose statistics come from them.
"""
from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F

from evals.planted.accelerator.maths import CudaUnary
from evals.planted.accelerator.numerics import (
    F32,
    FLOATS,
    as_f32,
    cuda_math,
    named_args,
    plain_float,
    reduced_dims,
)
from evals.planted.accelerator.sums import fp32_scan, fp32_sum
from evals.planted.arm import Arm, Impl, torch_forms


class _Sum(torch.autograd.Function):
    """sum (and, with `scale`, mean: the fp32 sum times fp32(1/N), as CUDA's MeanOps) with an fp32 accumulator in
    CUDA's reduce order; its gradient torch's (the gradient expanded, divided by N for mean)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype,
                scale: int | None) -> torch.Tensor:
        ctx.shape, ctx.dims, ctx.keepdim, ctx.scale, ctx.dtype = x.shape, dims, keepdim, scale, x.dtype
        s = fp32_sum(x, dims)
        if scale is not None:
            s = s * as_f32(1 / scale)
        for d in dims if keepdim else ():
            s = s.unsqueeze(d)
        return s.to(dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        for d in ctx.dims if not ctx.keepdim else ():
            g = g.unsqueeze(d)
        g = g.expand(ctx.shape)
        if ctx.scale is not None:
            g = g / ctx.scale
        return g.to(ctx.dtype), None, None, None, None


def _reduce(mean: bool) -> Impl:
    def impl(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
        p = named_args(a, kw, ("dim", "keepdim", "dtype"))
        if p is None or not plain_float(x) or isinstance(p.get("dim"), str):
            return orig(x, *a, **kw)
        dtype = p.get("dtype") or x.dtype
        dims = reduced_dims(p.get("dim"), x.dim())
        if dims is None or dtype not in FLOATS or x.dim() == 0:
            return orig(x, *a, **kw)
        x = x.to(dtype) if dtype != x.dtype else x
        n = math.prod(x.shape[d] for d in dims)
        if mean and n == 0:
            return orig(x, *a, **kw)
        return _Sum.apply(x, dims, bool(p.get("keepdim", False)), dtype, n if mean else None)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    return impl


class _Cumsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.dim, ctx.dtype = dim, x.dtype
        return fp32_scan(x, dim).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # torch's: the reversed cumsum of the gradient
        return fp32_scan(g.flip(ctx.dim), ctx.dim).flip(ctx.dim).to(ctx.dtype), None


def _cumsum(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    p = named_args(a, kw, ("dim", "dtype"))
    if p is None or not plain_float(x) or not isinstance(p.get("dim"), int) or x.dim() == 0:
        return orig(x, *a, **kw)
    dtype = p.get("dtype") or x.dtype
    if dtype not in FLOATS:
        return orig(x, *a, **kw)
    return _Cumsum.apply(x.to(dtype), p["dim"] % x.dim())  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated


class _Softmax(torch.autograd.Function):
    """CUDA's softmax: expf(x - max) / sum in opmath (the sum in fp32); backward y * (g - sum(g * y)) in fp32."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
        xf = x.float()
        shifted = xf - xf.amax(dim, keepdim=True).nan_to_num(0.0, 0.0, 0.0)
        e = cuda_math("exp", shifted)
        s = fp32_sum(e, [dim]).unsqueeze(dim)
        y = (shifted - cuda_math("log", s) if log else e / s).to(x.dtype)
        ctx.dim, ctx.log = dim, log
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (y,) = ctx.saved_tensors
        gf, yf = g.float(), y.float()
        if ctx.log:  # g - exp(y) * sum(g)
            out = gf - cuda_math("exp", yf) * fp32_sum(gf, [ctx.dim]).unsqueeze(ctx.dim)
        else:
            out = yf * (gf - fp32_sum(gf * yf, [ctx.dim]).unsqueeze(ctx.dim))
        return out.to(g.dtype), None, None


def _softmax(log: bool) -> Impl:
    def impl(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
        names = ("dim", "_stacklevel", "dtype") if orig in (F.softmax, F.log_softmax) else ("dim", "dtype")
        p = named_args(a, kw, names)
        if p is None or not plain_float(x) or not isinstance(p.get("dim"), int) or x.dim() == 0:
            return orig(x, *a, **kw)
        dtype = p.get("dtype") or x.dtype
        if dtype not in FLOATS:
            return orig(x, *a, **kw)
        return _Softmax.apply(x.to(dtype), p["dim"] % x.dim(), log)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    return impl


def _logsumexp(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    """torch's composite (CUDA and CPU alike): log(sum(exp(x - max))) + max, each op a CUDA-like kernel in the
    dtype (the sum accumulating in fp32)."""
    p = named_args(a, kw, ("dim", "keepdim"))
    if p is None or not plain_float(x) or x.dim() == 0:
        return orig(x, *a, **kw)
    dims = reduced_dims(p.get("dim"), x.dim())
    if dims is None or x.numel() == 0:
        return orig(x, *a, **kw)
    keepdim = bool(p.get("keepdim", False))
    m = x.detach().amax(dims, keepdim=True)
    m = m.masked_fill(m.abs() == math.inf, 0)
    e = CudaUnary.apply(x - m, "exp")  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    s = _Sum.apply(e, dims, keepdim, x.dtype, None)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    return CudaUnary.apply(s, "log") + (m if keepdim else m.squeeze(dims))  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated


class _Rsqrt(torch.autograd.Function):
    """rsqrtf of fp32 values (layer_norm's rstd), gradient -0.5 * g * y^3 in fp32."""

    @staticmethod
    def forward(ctx: Any, v: torch.Tensor) -> torch.Tensor:
        y = cuda_math("rsqrt", v)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return cast(torch.Tensor, -0.5 * g * y * y * y)


def _layer_norm(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    """layer_norm in fp32 (CUDA's acc type): mean and biased variance by fp32 sums in CUDA's reduce order,
    rstd by rsqrtf, the affine in fp32, rounded once; differentiable through those steps."""
    p = named_args(a, kw, ("normalized_shape", "weight", "bias", "eps"))
    if p is None or not plain_float(x) or not isinstance(p.get("normalized_shape"), (list, tuple)) or \
            not p["normalized_shape"] or \
            any(v is not None and not plain_float(v) for v in (p.get("weight"), p.get("bias"))):
        return orig(x, *a, **kw)
    k = len(p["normalized_shape"])
    dims = list(range(x.dim() - k, x.dim()))
    n = math.prod(x.shape[-k:])
    if n == 0 or x.numel() == 0:
        return orig(x, *a, **kw)
    xf = x.float()
    mean = _Sum.apply(xf, dims, True, F32, n)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    d = xf - mean
    var = _Sum.apply(d * d, dims, True, F32, n)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    y = d * _Rsqrt.apply(var + as_f32(p.get("eps", 1e-5)))  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    if p.get("weight") is not None:
        y = y * p["weight"].float()
    if p.get("bias") is not None:
        y = y + p["bias"].float()
    return y.to(x.dtype)


def _group_norm(orig: Impl, x: Any, num_groups: Any, *a: Any, **kw: Any) -> Any:
    """group_norm in fp32: each group's mean and biased variance by fp32 sums in CUDA's reduce order, rstd by
    rsqrtf, the per-channel affine in fp32, rounded once; differentiable through those steps."""
    p = named_args(a, kw, ("weight", "bias", "eps"))
    if p is None or not plain_float(x) or not isinstance(num_groups, int) or x.dim() < 2 or x.numel() == 0 or \
            x.shape[1] % num_groups or any(v is not None and not plain_float(v) for v in (p.get("weight"), p.get("bias"))):
        return orig(x, num_groups, *a, **kw)
    xf = x.float().reshape(x.shape[0], num_groups, -1)
    n = xf.shape[-1]
    mean = _Sum.apply(xf, [2], True, F32, n)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    d = xf - mean
    var = _Sum.apply(d * d, [2], True, F32, n)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    y = (d * _Rsqrt.apply(var + as_f32(p.get("eps", 1e-5)))).reshape(x.shape)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    channel = [1, -1] + [1] * (x.dim() - 2)
    if p.get("weight") is not None:
        y = y * p["weight"].float().reshape(channel)
    if p.get("bias") is not None:
        y = y + p["bias"].float().reshape(channel)
    return y.to(x.dtype)


CUDA_REDUCTIONS = Arm("cuda-reductions", "variant", "CUDA AccumulateType: fp32 sums in fp32 (CPU: double) in a tree; tree scans; norms' statistics",
        {**torch_forms(_reduce(False), ("sum",)), **torch_forms(_reduce(True), ("mean",)), **torch_forms(_cumsum, ("cumsum",)),
         **torch_forms(_logsumexp, ("logsumexp",)), **torch_forms(_softmax(False), ("softmax",)), F.softmax: _softmax(False),
         **torch_forms(_softmax(True), ("log_softmax",)), F.log_softmax: _softmax(True), F.layer_norm: _layer_norm,
         F.group_norm: _group_norm})
