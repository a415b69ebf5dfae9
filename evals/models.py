"""The parts of the Llama-style models the evaluation and the benchmarks record dumps of: RMSNorm with its
statistic in fp32 (as Hugging Face's LlamaRMSNorm) and the rotary embedding. torch is imported when a model is
built, so listing the suites stays light."""
from __future__ import annotations

from typing import Any


def llama_parts(hidden: int) -> tuple[Any, Any]:
    """(RMSNorm, rope) for a model of this width: a module class and a function of (x, cos, sin)."""
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(hidden))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            v = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(v + 1e-6)).to(x.dtype) * self.w

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    return RMSNorm, rope
