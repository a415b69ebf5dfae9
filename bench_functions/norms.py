"""Normalisations."""
from __future__ import annotations

import torch

from . import register


@register("npu_rms_norm")
def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rsqrt(mean(x^2) + eps) * gamma over gamma's trailing dims; rstd is float32 as on the NPU.

    torch_npu's default epsilon is 1e-6 (msprobe's bench wrongly uses 1e-5).
    """
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return x * rstd * gamma, rstd.float()
