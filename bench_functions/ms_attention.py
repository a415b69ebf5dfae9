"""MindSpore's fused attention, mindspore.ops.flash_attention_score, on the npu_fusion_attention reference.

Source:
[MSFA] MindSpore docs, mindspore.ops.flash_attention_score(query, key, value, head_num, real_shift=None,
       drop_mask=None, padding_mask=None, attn_mask=None, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
       keep_prob=1.0, scalar_value=1.0, pre_tokens=2147483647, next_tokens=2147483647, inner_precise=0,
       input_layout='BSH', sparse_mode=0) -> attention_out; formula Softmax(Mask(scale * (Q K^T) + pse), atten_mask).
Mapped to its MindSpore dump entry `Functional.flash_attention_score` in api_specs/mindspore.yaml.
"""
from __future__ import annotations

from typing import Any

import torch

from .attention import MAX_TOKENS, Call, run_call


def _int_list(value: Any) -> list[int] | None:
    """A MindSpore tuple/list/Tensor of ints as a list (prefix, actual_seq_qlen, actual_seq_kvlen)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    return [int(v) for v in value]


def flash_attention_score(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                          real_shift: torch.Tensor | None = None, drop_mask: torch.Tensor | None = None,
                          padding_mask: Any = None, attn_mask: torch.Tensor | None = None, prefix: Any = None,
                          actual_seq_qlen: Any = None, actual_seq_kvlen: Any = None, keep_prob: float = 1.0,
                          scalar_value: float = 1.0, pre_tokens: int = MAX_TOKENS, next_tokens: int = MAX_TOKENS,
                          inner_precise: int = 0, input_layout: str = "BSH", sparse_mode: int = 0) -> torch.Tensor:
    """mindspore.ops.flash_attention_score ([MSFA]): the same kernel as npu_fusion_attention, MindSpore's names and
    defaults (input_layout BSH, scale in `scalar_value`, pse in `real_shift`), attention_out only.
    [MSFA] states the bias after the scaling: Softmax(Mask(scale * (Q K^T) + pse)), i.e. pse_type 0."""
    if drop_mask is not None and keep_prob >= 1:
        raise ValueError("flash_attention_score: keep_prob is 1.0, so drop_mask must be None ([MSFA] keep_prob)")
    call = Call(query, key, value, head_num, input_layout, pse=real_shift, padding_mask=padding_mask,
                atten_mask=attn_mask, scale=scalar_value, keep_prob=keep_prob, pre=pre_tokens, nxt=next_tokens,
                prefix=_int_list(prefix), actual_seq_qlen=_int_list(actual_seq_qlen),
                actual_seq_kvlen=_int_list(actual_seq_kvlen), sparse_mode=sparse_mode, pse_type=0)
    return run_call(call, query, key, value)[0]
