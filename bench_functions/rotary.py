"""npu_rotary_mul (half and interleave) and its backward.

Source [ROT]: torch_npu docs, torch_npu.npu_rotary_mul (Ascend/op-plugin docs/context/torch_npu-npu_rotary_mul.md):
`npu_rotary_mul(input, r1, r2, rotary_mode='half')`; 功能说明 gives both modes as formulas, out = r1*x + r2*rot(x);
约束说明 lists the r1/r2 broadcast layouts (11SD/B1SD/BNSD, 1S1D/BS1D/BSND, S11D/SB1D/SBND), all plain broadcasting.
Backward schema: npu_rotary_mul_backward(grad, self, r1, r2, rotary_mode='half') -> (dx, dr1, dr2).
"""
from __future__ import annotations

import torch

MODES = ("half", "interleave")


def rotate(x: torch.Tensor, rotary_mode: str) -> torch.Tensor:
    """[ROT] half: cat(-x2, x1) of the two halves; interleave: pairs (x0, x1) -> (-x1, x0)."""
    if rotary_mode == "half":
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    if rotary_mode == "interleave":
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    raise ValueError(f"rotary_mode must be one of {MODES}, got {rotary_mode!r}")


def _rotate_transposed(y: torch.Tensor, rotary_mode: str) -> torch.Tensor:
    """The adjoint of `rotate` (it is a signed permutation, so the adjoint is its inverse)."""
    return -rotate(y, rotary_mode)


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast result back to `shape` (the gradient of broadcasting)."""
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def npu_rotary_mul(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                   rotary_mode: str = "half",  # [ROT] rotary_mode: 缺省为half
                   ) -> torch.Tensor:
    """out = r1 * x + r2 * rotate(x); shape and dtype of `input`."""
    return (r1 * input + r2 * rotate(input, rotary_mode)).to(input.dtype)


def npu_rotary_mul_backward(grad: torch.Tensor, self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                            rotary_mode: str = "half") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx = r1*g + rotate^T(r2*g); dr1, dr2 reduced over every broadcast dim (msprobe's covers only three layouts)."""
    dx = r1 * grad + _rotate_transposed(r2 * grad, rotary_mode)
    dr1 = _sum_to(grad * self, r1.shape)
    dr2 = _sum_to(grad * rotate(self, rotary_mode), r2.shape)
    return dx.to(self.dtype), dr1.to(r1.dtype), dr2.to(r2.dtype)


# In the device dtype, as eager torch computes `x * cos + rotate_half(x) * sin` (each op rounded to
# the input dtype): the `strict` standard's third run (api_specs/bench_functions.yaml `rounded`).

def npu_rotary_mul_rounded(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                           rotary_mode: str = "half") -> torch.Tensor:
    return input * r1.to(input.dtype) + rotate(input, rotary_mode) * r2.to(input.dtype)


def npu_rotary_mul_backward_rounded(grad: torch.Tensor, self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                                    rotary_mode: str = "half") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The eager autograd of npu_rotary_mul_rounded, in the input dtype."""
    dx = grad * r1.to(grad.dtype) + _rotate_transposed(grad * r2.to(grad.dtype), rotary_mode)
    dr1 = _sum_to(grad * self, r1.shape)
    dr2 = _sum_to(grad * rotate(self, rotary_mode), r2.shape)
    return dx.to(self.dtype), dr1.to(r1.dtype), dr2.to(r2.dtype)
