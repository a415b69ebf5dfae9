"""Shape and ordering ops: npu_confusion_transpose (+ backward), npu_sort_v2.

Sources:
[CT]  torch_npu docs, torch_npu.npu_confusion_transpose(self, perm, shape, transpose_first): transpose_first=True
      permutes then reshapes to `shape`, False reshapes to `shape` then permutes (docs' examples: (2,3,4,6),
      perm (0,2,1,3), shape (2,4,18), True -> (2,4,18); perm (0,2,1), shape (2,12,6), False -> (2,6,12)).
      Backward: torch_npu's autograd formula calls npu_confusion_transpose_backward(grad, perm, self.sizes(),
      !transpose_first), so `shape` is the forward input's shape and the flag is the backward's own order.
[SV2] torch_npu docs, torch_npu.npu_sort_v2(self, dim=-1, descending=False, out=None): sorted values, no indices.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def npu_confusion_transpose(self: torch.Tensor, perm: Sequence[int], shape: Sequence[int],
                            transpose_first: bool) -> torch.Tensor:
    """[CT] permute-then-reshape or reshape-then-permute."""
    if transpose_first:
        return self.permute(*perm).reshape(*shape)
    return self.reshape(*shape).permute(*perm)


def npu_confusion_transpose_backward(grad: torch.Tensor, perm: Sequence[int], shape: Sequence[int],
                                     transpose_first: bool) -> torch.Tensor:
    """[CT] undo the forward; transpose_first=True undoes a reshape-first forward (permute back, then reshape)."""
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    if transpose_first:
        return grad.permute(*inverse).reshape(*shape)
    return grad.reshape(*[shape[p] for p in perm]).permute(*inverse)


def npu_sort_v2(self: torch.Tensor, dim: int = -1, descending: bool = False,  # [SV2] defaults
                out: torch.Tensor | None = None) -> torch.Tensor:
    """[SV2] the values of torch.sort (the NPU kernel supports dim=-1 only; any dim works here)."""
    values = torch.sort(self, dim=dim, descending=descending).values
    if out is not None:
        with torch.no_grad():
            out.resize_(values.shape).copy_(values)
        return out
    return values
