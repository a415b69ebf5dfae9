"""Mixture-of-experts routing: npu_moe_gating_top_k_softmax.

Source [MOE]: torch_npu docs, torch_npu.npu_moe_gating_top_k_softmax(x, finished=None, k=1) -> (y, expert_idx,
row_idx), 计算公式: softmaxOut = softmax(x, -1); yOut, expertIdxOut = topK(softmaxOut, k);
rowIdxOut = arange(rows * k).reshape(k, rows).transpose(1, 0); y has x's dtype, expert_idx and row_idx int32.
"""
from __future__ import annotations

import torch

from . import BenchUnsupported


def npu_moe_gating_top_k_softmax(x: torch.Tensor, finished: torch.Tensor | None = None,
                                 k: int = 1,  # [MOE] 函数原型 k=1
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[MOE] top-k of softmax(x) per row; 3-D x is read as rows = all leading dims."""
    if finished is not None and bool(finished.bool().any()):
        raise BenchUnsupported("npu_moe_gating_top_k_softmax with finished rows: their outputs are not documented")
    if not 0 < k <= x.shape[-1]:
        raise ValueError(f"k must be in (0, {x.shape[-1]}], got {k}")
    probs = torch.softmax(x.to(torch.promote_types(x.dtype, torch.float32)), dim=-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[..., :k]  # ties: lower expert first
    y = torch.gather(probs, -1, order).to(x.dtype)
    rows = y[..., 0].numel()
    row_idx = torch.arange(rows * k, device=x.device, dtype=torch.int32).reshape(k, rows).t().reshape(y.shape)
    return y, order.to(torch.int32), row_idx
