"""A deliberately approximate softmax: exp(x) / sum(exp(x)) without subtracting the row maximum.

Textbook-correct and fine for small logits, but exp overflows float32 above ~88.7, so a row with a
large logit becomes inf / inf = NaN. The signature is torch.nn.functional.softmax's.
"""
from __future__ import annotations

import torch


def softmax(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    if dtype is not None:
        input = input.to(dtype)
    if dim is None:
        dim = -1
    e = torch.exp(input)  # the bug: no input - input.amax(dim, keepdim=True) first
    return e / e.sum(dim, keepdim=True)
