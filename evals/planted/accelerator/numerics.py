"""What every accelerator-like kernel shares: the CUDA Math API's ULP bounds, a deterministic perturbation
within them (a hash of the input's bits), and the argument readers that leave unknown calls to torch.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
F32 = torch.float32

# CUDA Math API (CUDA C++ Programming Guide, "Mathematical Functions"), float: the documented bound, and
# the perturbation drawn here, in ULPs before rounding (|error| <= max(|lo|, |hi|) + 0.5). sin and cos
# lean away from zero as an H100 measured (+0.097 ULP mean, 1.44 max); the others are nearly unbiased.
ULPS: dict[str, tuple[Callable[..., torch.Tensor], float, float, bool, float]] = {
    # name: (fp64 function, lo, hi, away from zero, documented bound)
    "sin": (torch.sin, -0.8, 1.0, True, 2),
    "cos": (torch.cos, -0.8, 1.0, True, 2),
    "exp": (torch.exp, -0.95, 1.05, False, 2),
    "log": (torch.log, -0.45, 0.45, False, 1),
    "tanh": (torch.tanh, -1.0, 1.0, False, 2),
    "rsqrt": (torch.rsqrt, -0.95, 1.05, False, 2),
    "erf": (torch.erf, -1.0, 1.0, False, 2),
    "pow": (torch.pow, -3.0, 3.0, False, 8),
    # 6 outside (-10.001, -2.264), larger inside: the same draw everywhere
    "lgamma": (torch.lgamma, -3.0, 3.0, False, 6),
    "erfinv": (torch.erfinv, -1.0, 1.0, False, 2),
}
SALT = {name: i * 0x1F3D5B7 + 0x2545F49 for i, name in enumerate(ULPS)}


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The element's bit pattern as int64 (fp32 and 16-bit floats)."""
    x = x.detach().contiguous()
    if x.dtype == F32:
        return x.view(torch.int32).long() & 0xFFFFFFFF
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.view(torch.int16).long() & 0xFFFF
    return x.double().float().view(torch.int32).long() & 0xFFFFFFFF


def hash_unit(salt: int, *xs: torch.Tensor) -> torch.Tensor:
    """A number in [0, 1) per element, a function of the elements' bits only (no RNG state)."""
    mask = 0xFFFFFFFF
    h = torch.full((), salt & mask, dtype=torch.int64)
    for x in xs:
        h = (h * 0x2C1B3C6D + _bits(x)) & mask
        for _ in range(2):  # a murmur-style finaliser; every product stays below 2^63
            h = h ^ (h >> 16)
            h = (h * 0x45D9F3B) & mask
        h = h ^ (h >> 16)
    return h.double() / 2.0 ** 32


def ulp32(v: torch.Tensor) -> torch.Tensor:
    """fp32's unit in the last place at fp64 values `v` (2^-149 at and below the subnormals)."""
    _, e = torch.frexp(v.double())
    return torch.ldexp(torch.ones_like(v, dtype=torch.float64), (e - 24).clamp(min=-149))


def perturb(exact: torch.Tensor, unit: torch.Tensor, lo: float, hi: float, away: bool) -> torch.Tensor:
    """The fp64 `exact` moved by lo..hi fp32 ULPs (`unit` picks where), rounded to fp32. Zeros, infinities and
    NaN stay as they are, as does a value the move would overflow."""
    e = lo + (hi - lo) * unit
    if away:
        e = e * torch.sign(exact)
    out = (exact + e * ulp32(exact)).float()
    plain = exact.float()
    return torch.where(torch.isfinite(out) & (exact != 0), out, plain)


def cuda_math(name: str, x: torch.Tensor) -> torch.Tensor:
    """CUDA's `<name>f` of x's opmath (fp32) value, within its ULP bound; rounded once to x's dtype."""
    fn, lo, hi, away, _ = ULPS[name]
    xf = x.float()
    return perturb(fn(xf.double()), hash_unit(SALT[name], xf), lo, hi, away).to(x.dtype)


def plain_float(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in FLOATS


def named_args(a: tuple[Any, ...], kw: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any] | None:
    """Positional and keyword arguments by name; None when there are unknown ones (left to torch)."""
    if len(a) > len(names) or set(kw) - set(names):
        return None
    return {**dict(zip(names, a)), **kw}


def reduced_dims(dim: Any, ndim: int) -> list[int] | None:
    if dim is None:
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims or not all(isinstance(d, int) for d in dims):
        return None
    return sorted({d % max(ndim, 1) for d in dims})


SIXTEEN = (torch.float16, torch.bfloat16)


def as_f32(v: Any) -> torch.Tensor:
    """A Python number as an fp32 scalar tensor (rounded once)."""
    return torch.tensor(float(v), dtype=F32)
