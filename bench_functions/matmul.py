"""Matrix products: npu_linear (+ backward), matmul_backward, npu_grouped_matmul.

Sources:
[LIN] torch_npu docs, torch_npu.npu_linear(input, weight, bias=None): 2-D input (M, K), weight (N, K), bias (N,);
      the docs' example (x (2,16), w (4,16) -> (2,4)) is torch.nn.functional.linear. Backward schema:
      npu_linear_backward(Tensor grad, Tensor input, Tensor weight) -> (grad_input, grad_weight).
[MMB] aten schema matmul_backward(Tensor grad, Tensor self, Tensor other, bool[2] mask) -> (Tensor, Tensor).
[GMM] torch_npu docs, torch_npu.npu_grouped_matmul (Ascend/op-plugin docs/context/torch_npu-npu_grouped_matmul.md):
      非量化场景 y_i = x_i @ weight_i + bias_i; group_list (List[int] cumulative, or Tensor read per
      group_list_type: 0 cumsum (default), 1 counts, 2 [E, 2] pairs); split_item 0/1 -> one output per weight,
      2/3 -> one output; group_type -1 no grouping, 0 m-axis; act_type only with per-token quantisation.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from . import BenchUnsupported


def npu_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[LIN] y = input @ weight^T + bias."""
    return F.linear(input, weight, bias)


def npu_linear_backward(grad: torch.Tensor, input: torch.Tensor,
                        weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[LIN] grad_input = grad @ weight, grad_weight = grad^T @ input (leading dims folded into rows)."""
    g2, x2 = grad.reshape(-1, grad.shape[-1]), input.reshape(-1, input.shape[-1])
    return (grad @ weight).to(input.dtype), (g2.t() @ x2).to(weight.dtype)


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead > 0 else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def matmul_backward(grad: torch.Tensor, self: torch.Tensor, other: torch.Tensor,
                    mask: Sequence[bool] = (True, True)) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """[MMB] The adjoints of torch.matmul for every rank combination; None where mask is False.

    1-D operands are lifted to matrices (a row vector on the left, a column vector on the right), the
    batched adjoints g @ b^T and a^T @ g are formed with broadcasting and summed back to each shape.
    """
    a = self.unsqueeze(0) if self.dim() == 1 else self
    b = other.unsqueeze(-1) if other.dim() == 1 else other
    g = grad.unsqueeze(-1) if other.dim() == 1 else grad
    g = g.unsqueeze(-2) if self.dim() == 1 else g
    grad_self = grad_other = None
    if mask[0]:
        grad_self = _sum_to(g @ b.transpose(-1, -2), a.shape)
        grad_self = grad_self.squeeze(0) if self.dim() == 1 else grad_self
    if mask[1]:
        grad_other = _sum_to(a.transpose(-1, -2) @ g, b.shape)
        grad_other = grad_other.squeeze(-1) if other.dim() == 1 else grad_other
    return grad_self, grad_other


def _group_sizes(group_list: Any, group_list_type: int | None) -> list[int]:
    """[GMM] group_list as per-group row counts."""
    if isinstance(group_list, (list, tuple)):  # List[int]: non-negative increasing cumulative offsets
        values, kind = [int(v) for v in group_list], 0
    else:
        values, kind = group_list.detach().cpu().long().tolist(), 0 if group_list_type is None else int(group_list_type)
    if kind == 0:
        return [b - a for a, b in zip([0] + values[:-1], values)]
    if kind == 1:
        return values
    raise BenchUnsupported(f"npu_grouped_matmul group_list_type={kind}: only for int8 inputs, not benched")


def npu_grouped_matmul(x: Sequence[torch.Tensor], weight: Sequence[torch.Tensor], *,
                       bias: Sequence[torch.Tensor] | None = None, scale: Any = None, offset: Any = None,
                       antiquant_scale: Any = None, antiquant_offset: Any = None, per_token_scale: Any = None,
                       group_list: Any = None, activation_input: Any = None, activation_quant_scale: Any = None,
                       activation_quant_offset: Any = None,
                       split_item: int = 0,  # [GMM] 函数原型 split_item=0
                       group_type: int | None = None,
                       group_list_type: int = 0,  # [GMM] group_list_type: 0 默认值, cumsum
                       act_type: int = 0, output_dtype: torch.dtype | None = None,
                       tuning_config: Any = None) -> list[torch.Tensor]:
    """[GMM] the non-quantised path: y_i = x_i @ w_i + b_i, x rows split by group_list when x is one tensor.

    With one x and a group list that covers fewer rows than x has, the rows past the last group get
    zeros here; the NPU leaves them stale, which api_specs/bench_functions.yaml's output_postprocess
    rule (valid_rows_from: group_list) zeroes on the device side before comparing.
    """
    quant = {"scale": scale, "offset": offset, "antiquant_scale": antiquant_scale, "per_token_scale": per_token_scale,
             "antiquant_offset": antiquant_offset, "activation_input": activation_input,
             "activation_quant_scale": activation_quant_scale, "activation_quant_offset": activation_quant_offset}
    used = [k for k, v in quant.items() if v is not None] + (["act_type"] if act_type else [])
    if used:
        raise BenchUnsupported(f"npu_grouped_matmul with {', '.join(used)}: quantised paths are not benched")
    if group_type not in (None, -1, 0):
        raise BenchUnsupported(f"npu_grouped_matmul group_type={group_type}: only -1 and 0 are documented")
    xs, ws = list(x), list(weight)
    if len(ws) == 1 and ws[0].dim() == 3:  # one (g, k, n) weight = g experts
        ws = list(ws[0].unbind(0))
    bs: list[torch.Tensor | None] = [None] * len(ws)
    if bias is not None:
        bl = list(bias)
        bs = list(bl[0].unbind(0) if len(bl) == 1 and bl[0].dim() == 2 else bl)
    if len(xs) == 1 and len(ws) > 1:  # one x split along m by group_list
        if group_list is None:
            raise ValueError("npu_grouped_matmul: one x and several weights need group_list")
        sizes = _group_sizes(group_list, group_list_type)
        if len(sizes) != len(ws) or sum(sizes) > xs[0].shape[0]:
            raise ValueError(f"group_list {sizes} does not fit {len(ws)} weights and {xs[0].shape[0]} rows")
        xs = list(torch.split(xs[0][:sum(sizes)], sizes))
    elif len(xs) != len(ws):
        raise ValueError(f"npu_grouped_matmul: {len(xs)} x tensors for {len(ws)} weights")
    ys = [xi @ wi + (0 if bi is None else bi) for xi, wi, bi in zip(xs, ws, bs)]
    dtype = output_dtype or x[0].dtype
    if split_item in (0, 1):
        return [y.to(dtype) for y in ys]
    out = torch.cat(ys, dim=0)
    rows = x[0].shape[0] if len(x) == 1 else out.shape[0]
    if rows > out.shape[0]:  # rows past the last group are not written by the NPU
        out = torch.cat((out, out.new_zeros(rows - out.shape[0], *out.shape[1:])), dim=0)
    return [out.to(dtype)]
