"""cuda-fma-optimizer: fused multiply-adds (addcdiv, addcmul, lerp, add with alpha) rounded once in fp32
opmath, as an optimizer step runs them on CUDA.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from evals.planted.accelerator.numerics import (
    as_f32,
    named_args,
    plain_float,
)
from evals.planted.arm import Arm, Impl, torch_forms


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fmaf(a, b, c) of fp32 tensors: a * b + c rounded once. The product is exact in fp64; the fp64 sum's rounding
    error (TwoSum) settles the one case where rounding it again to fp32 could go the wrong way (a tie)."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bv = s - p
    err = (p - (s - bv)) + (cd - bv)
    r = s.float()
    back = r.double()
    toward = torch.nextafter(r, torch.where(s > back, torch.tensor(math.inf), torch.tensor(-math.inf)))
    tie = (s != back) & (s == (back + toward.double()) / 2) & (err != 0)
    beyond = tie & (torch.sign(err) == torch.sign(s - back))  # the exact sum lies past the tie, away from r
    return torch.where(beyond, toward, r)


def _fma_inplace(target: torch.Tensor, value: torch.Tensor, inplace: bool) -> torch.Tensor:
    if inplace:
        target.copy_(value)
        return target
    return value


def _needs_grad(*xs: Any) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)


def _fused_pointwise(product: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
                     ) -> Impl:
    """self + value * (t1 op t2) in opmath with the multiply-add fused (nvcc contracts it): `product(value, t1, t2)`
    gives the two fp32 factors the FMA multiplies; calls it cannot take go to torch."""
    def impl(orig: Impl, x: Any, t1: Any, t2: Any, *a: Any, **kw: Any) -> Any:
        p = named_args(a, kw, ("value",))
        if p is None or not all(plain_float(t) for t in (x, t1, t2)) or _needs_grad(x, t1, t2) or \
                len({x.dtype, t1.dtype, t2.dtype}) != 1:
            return orig(x, t1, t2, *a, **kw)
        shape = torch.broadcast_shapes(x.shape, t1.shape, t2.shape)  # type: ignore[no-untyped-call]  # unannotated in torch
        inplace = getattr(orig, "__name__", "").endswith("_")
        if inplace and shape != x.shape:
            return orig(x, t1, t2, *a, **kw)
        f1, f2 = product(as_f32(p.get("value", 1)), t1.float(), t2.float())
        out = fma32(f1.expand(shape), f2.expand(shape), x.float().expand(shape)).to(x.dtype)
        return _fma_inplace(x, out, inplace)
    return impl


# CUDA's addcdiv: value times the rounded quotient; addcmul: (value * t1) rounded, then fused with t2
_addcdiv = _fused_pointwise(lambda value, t1, t2: (value, t1 / t2))
_addcmul = _fused_pointwise(lambda value, t1, t2: (value * t1, t2))


def _lerp(orig: Impl, x: Any, end: Any, weight: Any, *a: Any, **kw: Any) -> Any:
    """CUDA's lerp: |w| < 0.5 ? fma(w, end - self, self) : fma(-(end - self), 1 - w, end), in opmath."""
    if a or kw or not plain_float(x) or not plain_float(end) or x.dtype != end.dtype or \
            _needs_grad(x, end, weight) or not (type(weight) in (int, float) or plain_float(weight)):
        return orig(x, end, weight, *a, **kw)
    w = weight.float() if isinstance(weight, torch.Tensor) else as_f32(weight)
    shape = torch.broadcast_shapes(x.shape, end.shape, w.shape)  # type: ignore[no-untyped-call]  # unannotated in torch
    inplace = getattr(orig, "__name__", "").endswith("_")
    if inplace and shape != x.shape:
        return orig(x, end, weight, *a, **kw)
    s, e, w = (t.float().expand(shape) for t in (x, end, w))
    diff = e - s
    out = torch.where(w.abs() < 0.5, fma32(w, diff, s), fma32(-diff, 1 - w, e)).to(x.dtype)
    return _fma_inplace(x, out, inplace)


def _add_alpha(orig: Impl, x: Any, other: Any, *a: Any, **kw: Any) -> Any:
    """CUDA's add with alpha: self + alpha * other in opmath, fused: fma(alpha, other, self)."""
    alpha = kw.get("alpha", 1)
    if a or set(kw) - {"alpha"} or alpha == 1 or type(alpha) not in (int, float) or not plain_float(x) or \
            not plain_float(other) or x.dtype != other.dtype or _needs_grad(x, other):
        return orig(x, other, *a, **kw)
    shape = torch.broadcast_shapes(x.shape, other.shape)  # type: ignore[no-untyped-call]  # unannotated in torch
    inplace = getattr(orig, "__name__", "").endswith("_")
    if inplace and shape != x.shape:
        return orig(x, other, *a, **kw)
    out = fma32(as_f32(alpha).expand(shape), other.float().expand(shape), x.float().expand(shape)).to(x.dtype)
    return _fma_inplace(x, out, inplace)


CUDA_FMA_OPTIMIZER = Arm("cuda-fma-optimizer", "variant", "CUDA fused multiply-add: addcdiv/addcmul/lerp/add(alpha) in fp32 opmath",
        {**torch_forms(_addcdiv, ("addcdiv", "addcdiv_")), **torch_forms(_addcmul, ("addcmul", "addcmul_")),
         **torch_forms(_lerp, ("lerp", "lerp_")), **torch_forms(_add_alpha, ("add", "add_"))})
