"""Elementwise fused activations."""
from __future__ import annotations

import torch

from . import register


@register("npu_fast_gelu")
def npu_fast_gelu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(1.702 x), written so large |x| neither overflows nor loses the sign."""
    return x * torch.sigmoid(1.702 * x)


@register("npu_swiglu")
def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """silu(first half) * second half along `dim`."""
    a, b = torch.chunk(x, 2, dim=dim)
    return torch.nn.functional.silu(a) * b
