"""Quantisation: npu_dynamic_quant.

Source:
[DQ] torch_npu docs, torch_npu.npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None)
     -> (y, scale): per-token symmetric dynamic quantisation. With smooth_scales the input is first multiplied by
     them; scale = row_max(abs(x)) / 127 over the last dimension (float32, shape input.shape[:-1]);
     y = round(x / scale) as int8. dst_type torch.int8 (default) or a packed int4 type; group_index selects a row of
     smooth_scales per group of rows (MoE).

Integer outputs of this op are judged by msprobe 26.x's quantisation rule (api_specs/thresholds.yaml
`quantization`): one step of rounding difference passes.
"""
from __future__ import annotations

import torch

from . import BenchUnsupported

_INT8_MAX = 127.0


def npu_dynamic_quant(input: torch.Tensor, *, smooth_scales: torch.Tensor | None = None,
                      group_index: torch.Tensor | None = None,
                      dst_type: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 y, float32 scale) per row of the last dimension, computed in at least float32 [DQ]."""
    if group_index is not None:
        raise BenchUnsupported("npu_dynamic_quant with group_index (per-group smooth scales) has no reference here")
    if dst_type not in (None, torch.int8):
        raise BenchUnsupported(f"npu_dynamic_quant to {dst_type}: only int8 output has a reference here")
    work = torch.promote_types(input.dtype, torch.float32)
    x = input.to(work)
    if smooth_scales is not None:
        x = x * smooth_scales.to(work)
    scale = x.abs().amax(dim=-1) / _INT8_MAX
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    y = torch.round(x / safe.unsqueeze(-1)).clamp_(-_INT8_MAX - 1, _INT8_MAX).to(torch.int8)
    return y, scale.float()
