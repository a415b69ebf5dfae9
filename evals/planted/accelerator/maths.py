"""cuda-sincos, cuda-math: maths functions within the CUDA Math API's ULP bounds rather than correctly
rounded, and silu, gelu, sigmoid and pow built from them, each with its gradient by torch's formula.
"""
from __future__ import annotations

import math
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F

from evals.planted.accelerator.numerics import (
    F32,
    SALT,
    ULPS,
    cuda_math,
    hash_unit,
    perturb,
    plain_float,
)
from evals.planted.accelerator.sums import sum_to
from evals.planted.arm import Arm, Impl, torch_forms


def _cube(y: torch.Tensor) -> torch.Tensor:
    """y.pow(3) as CUDA's pow kernel specialises it: y * y * y in opmath, rounded once."""
    yf = y.float()
    return (yf * yf * yf).to(y.dtype)


def _in_opmath(fn: Callable[..., torch.Tensor], *ts: torch.Tensor) -> torch.Tensor:
    return fn(*(t.float() for t in ts)).to(ts[0].dtype)


# backward formulas of torch's derivatives.yaml, each op a CUDA-like kernel in the dtype
_BACKWARD: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sin": lambda g, x, y: g * cuda_math("cos", x),
    "cos": lambda g, x, y: g * cuda_math("sin", x).neg(),
    "exp": lambda g, x, y: g * y,
    "log": lambda g, x, y: g / x,
    "tanh": lambda g, x, y: _in_opmath(lambda gf, yf: gf * (1 - yf * yf), g, y),  # tanh_backward
    "rsqrt": lambda g, x, y: (-0.5 * g) * _cube(y),  # from the kernel's own result, as CUDA's autograd does
    "erf": lambda g, x, y: 2.0 / math.sqrt(math.pi) * cuda_math("exp", -(x * x)) * g,
    "lgamma": lambda g, x, y: g * torch.digamma(x),
    # 0.5 * sqrt(pi) * exp(erfinv(x)^2) * g from the kernel's own erfinv: y's error grows by 2 y^2
    "erfinv": lambda g, x, y: _in_opmath(lambda gf, yf: 0.5 * math.sqrt(math.pi) * cuda_math("exp", yf * yf) * gf,
                                         g, y),
}


class CudaUnary(torch.autograd.Function):
    """A CUDA-like maths function; its gradient by torch's formula, with CUDA-like kernels."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str) -> torch.Tensor:
        y = cuda_math(name, x)
        ctx.name = name
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        x, y = ctx.saved_tensors
        return _BACKWARD[ctx.name](g, x, y), None


def _unary(name: str) -> Impl:
    def impl(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
        if a or kw or not plain_float(x):
            return orig(x, *a, **kw)
        return CudaUnary.apply(x, name)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    return impl


def _pow_value(base: Any, exp: Any, dtype: torch.dtype) -> torch.Tensor:
    """CUDA's pow kernel: a scalar exponent of 2, 3, 0.5, -0.5, -1 or -2 is specialised (products, sqrt, rsqrt,
    reciprocal), every other call is powf (8 ULP bound); opmath fp32, rounded once to `dtype`."""
    if isinstance(exp, (int, float)) and isinstance(base, torch.Tensor):
        b = base.float()
        special = {2: lambda: b * b, 3: lambda: b * b * b, 0.5: lambda: torch.sqrt(b), -1: lambda: 1 / b,
                   -2: lambda: 1 / (b * b), -0.5: lambda: cuda_math("rsqrt", b)}
        if exp in special:
            return special[exp]().to(dtype)
    b = base.float() if isinstance(base, torch.Tensor) else torch.tensor(float(base), dtype=F32)
    e = exp.float() if isinstance(exp, torch.Tensor) else torch.tensor(float(exp), dtype=F32)
    b, e = torch.broadcast_tensors(b, e)  # type: ignore[no-untyped-call]  # unannotated in torch
    _, lo, hi, away, _ = ULPS["pow"]
    exact = torch.pow(b.double(), e.double())
    out = perturb(exact, hash_unit(SALT["pow"], b, e), lo, hi, away)
    return torch.where(exact == exact.float().double(), exact.float(), out).to(dtype)  # representable: exact


class _Pow(torch.autograd.Function):
    """pow(base, exponent), either a Python number; gradients by torch's pow_backward formulas."""

    @staticmethod
    def forward(ctx: Any, base: Any, exp: Any, dtype: torch.dtype) -> torch.Tensor:
        y = _pow_value(base, exp, dtype)
        ctx.scalars = [None if isinstance(v, torch.Tensor) else v for v in (base, exp)]
        ctx.save_for_backward(*(t for t in (base, exp) if isinstance(t, torch.Tensor)), y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        saved = list(ctx.saved_tensors)
        y = saved.pop()
        base, exp = (saved.pop(0) if v is None else v for v in ctx.scalars)
        gb = ge = None
        if ctx.needs_input_grad[0]:  # grad * (exponent * self.pow(exponent - 1)), 0 where the exponent is 0
            term = exp * _pow_value(base, exp - 1, base.dtype)
            gb = torch.where(torch.as_tensor(exp == 0), torch.zeros_like(term), term) * g
            gb = sum_to(gb, base.shape, base.dtype) if gb.shape != base.shape else gb.to(base.dtype)
        if ctx.needs_input_grad[1]:  # grad * (result * log(self)), 0 where self is 0 and exponent >= 0
            logb = cuda_math("log", base) if isinstance(base, torch.Tensor) else math.log(base) if base > 0 \
                else float("nan")
            term = y * logb
            cond = torch.as_tensor(base == 0) & torch.as_tensor(exp >= 0)
            ge = torch.where(cond, torch.zeros_like(term), term) * g
            ge = sum_to(ge, exp.shape, exp.dtype) if ge.shape != exp.shape else ge.to(exp.dtype)
        return gb, ge, None


def _pow(orig: Impl, base: Any, exp: Any, *a: Any, **kw: Any) -> Any:
    name = getattr(orig, "__name__", "")
    if name == "__rpow__":  # x.__rpow__(b) is b ** x
        base, exp = exp, base
    tensors = [t for t in (base, exp) if isinstance(t, torch.Tensor)]
    scalars_ok = all(isinstance(v, torch.Tensor) or (type(v) in (int, float)) for v in (base, exp))
    if a or kw or not tensors or not scalars_ok or not all(plain_float(t) for t in tensors) or \
            (not isinstance(base, torch.Tensor) and base <= 0):
        return orig(*((exp, base) if name == "__rpow__" else (base, exp)), *a, **kw)
    dtype = torch.result_type(base, exp)
    return _Pow.apply(base, exp, dtype)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated


def _sigmoid_f(xf: torch.Tensor) -> torch.Tensor:
    """CUDA's sigmoid in opmath: 1 / (1 + expf(-x))."""
    return 1 / (1 + cuda_math("exp", -xf))


class _Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = _sigmoid_f(x.float()).to(x.dtype)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return _in_opmath(lambda gf, yf: gf * (1 - yf) * yf, g, y)  # sigmoid_backward


class _Silu(torch.autograd.Function):
    """CUDA's silu: x / (1 + expf(-x)) in opmath; its backward dy * s * (1 + x * (1 - s))."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        xf = x.float()
        return (xf / (1 + cuda_math("exp", -xf))).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        xf = x.float()
        s = _sigmoid_f(xf)
        return cast(torch.Tensor, (g.float() * s * (1 + xf * (1 - s))).to(x.dtype))


_K_ALPHA = float(torch.tensor(math.sqrt(0.5), dtype=F32))
_K_BETA = float(torch.tensor(2 / math.sqrt(math.pi) * math.sqrt(0.5) * 0.5, dtype=F32))


class _Gelu(torch.autograd.Function):
    """CUDA's exact gelu: x * 0.5 * (1 + erff(x * sqrt(1/2))) in opmath; backward dy * (cdf + x * pdf)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        xf = x.float()
        return (xf * 0.5 * (1 + cuda_math("erf", xf * _K_ALPHA))).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        xf = x.float()
        cdf = 0.5 * (1 + cuda_math("erf", xf * _K_ALPHA))
        pdf = cuda_math("exp", -0.5 * xf * xf) * _K_BETA
        return cast(torch.Tensor, (g.float() * (cdf + xf * pdf)).to(x.dtype))


def _silu(orig: Impl, x: Any, inplace: bool = False) -> Any:
    return _Silu.apply(x) if plain_float(x) and not inplace else orig(x, inplace=inplace)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated


def _gelu(orig: Impl, x: Any, approximate: str = "none") -> Any:
    return _Gelu.apply(x) if plain_float(x) and approximate == "none" else orig(x, approximate=approximate)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated


def _sigmoid(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    return _Sigmoid.apply(x) if plain_float(x) and not a and not kw else orig(x, *a, **kw)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated


CUDA_SINCOS = Arm("cuda-sincos", "variant", "CUDA sinf/cosf: within 2 ULP, leaning +0.1 ULP away from zero (H100)",
        {**torch_forms(_unary("sin"), ("sin",)), **torch_forms(_unary("cos"), ("cos",))})


CUDA_MATH = Arm("cuda-math", "variant", "CUDA Math API: exp/tanh/rsqrt/erf/erfinv 2, log 1, lgamma 6, pow 8 ULP; silu, gelu, sigmoid from them",
        {**torch_forms(_unary("exp"), ("exp",)), **torch_forms(_unary("log"), ("log",)), **torch_forms(_unary("tanh"), ("tanh",)),
         **torch_forms(_unary("rsqrt"), ("rsqrt",)), **torch_forms(_unary("erf"), ("erf",)), **torch_forms(_sigmoid, ("sigmoid",)),
         F.silu: _silu, F.gelu: _gelu, **torch_forms(_pow, ("pow", "__pow__", "__rpow__")),
         **torch_forms(_unary("lgamma"), ("lgamma",)), **torch_forms(_unary("erfinv"), ("erfinv",))})
