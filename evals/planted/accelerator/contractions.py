"""cuda-contractions: fp32 accumulation in K-chunks added in a tree (linear, matmul) and transposed
convolutions summed by channel chunks.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from evals.planted.accelerator.numerics import (
    named_args,
    plain_float,
)
from evals.planted.arm import Arm, Impl, torch_forms

CHANNEL_CHUNK = 2  # a transposed convolution's input channels summed in chunks of this many, the chunks in turn


def _conv_transpose(conv: Callable[..., torch.Tensor]) -> Impl:
    """conv_transpose in fp32 with the input channels cut into chunks of CHANNEL_CHUNK: each chunk's output
    in fp32, the partials added one after another, the bias last, rounded once (another order of the same
    fp32 sums)."""
    def impl(orig: Impl, x: Any, weight: Any, bias: Any = None, *a: Any, **kw: Any) -> Any:
        p = named_args(a, kw, ("stride", "padding", "output_padding", "groups", "dilation"))
        if p is None or p.get("groups", 1) != 1 or not plain_float(x) or not plain_float(weight) or \
                (bias is not None and not plain_float(bias)) or x.dim() not in (weight.dim(), weight.dim() - 1):
            return orig(x, weight, bias, *a, **kw)
        c = 1 if x.dim() == weight.dim() else 0  # an unbatched input has its channels first
        if x.shape[c] <= CHANNEL_CHUNK:
            return orig(x, weight, bias, *a, **kw)
        rest = {k: v for k, v in p.items() if k != "groups"}
        xf, wf = x.float(), weight.float()
        total = None
        for i in range(0, x.shape[c], CHANNEL_CHUNK):
            part = conv(xf.narrow(c, i, min(CHANNEL_CHUNK, x.shape[c] - i)), wf[i:i + CHANNEL_CHUNK], None, **rest)
            total = part if total is None else total + part
        assert total is not None
        if bias is not None:
            total = total + bias.float().reshape([-1] + [1] * (total.dim() - c - 1))
        return total.to(x.dtype)
    return impl


K_CHUNK = 32


def chunked_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32: K cut into chunks of K_CHUNK, each chunk's product in fp32, the partials added in a tree."""
    k = a.shape[-1]
    stack: list[tuple[int, torch.Tensor]] = []
    for i in range(0, k, K_CHUNK):
        part, level = a[..., i:i + K_CHUNK].float() @ b[..., i:i + K_CHUNK, :].float(), 0
        while stack and stack[-1][0] == level:
            part, level = stack.pop()[1] + part, level + 1
        stack.append((level, part))
    total = stack.pop()[1]
    while stack:
        total = stack.pop()[1] + total
    return total


def _mm(orig: Impl, a: Any, b: Any, *rest: Any, **kw: Any) -> Any:
    if rest or kw or not plain_float(a) or not plain_float(b) or a.dtype != b.dtype or a.dim() < 2 or \
            b.dim() < 2 or a.shape[-1] == 0:
        return orig(a, b, *rest, **kw)
    return chunked_matmul(a, b).to(a.dtype)


def _linear(orig: Impl, x: Any, weight: Any, bias: Any = None) -> Any:
    """F.linear with the bias added to the fp32 accumulator (a cuBLASLt epilogue), rounded once."""
    if not plain_float(x) or not plain_float(weight) or x.dtype != weight.dtype or x.dim() < 2 or \
            weight.dim() != 2 or (bias is not None and not plain_float(bias)) or x.shape[-1] == 0:
        return orig(x, weight, bias)
    out = chunked_matmul(x, weight.transpose(0, 1))
    return (out + bias.float() if bias is not None else out).to(x.dtype)


CUDA_CONTRACTIONS = Arm("cuda-contractions", "variant", "fp32 accumulation in K-chunks of 32 added in a tree (linear/matmul); conv_transpose by channel chunks",
        {F.linear: _linear, **torch_forms(_mm, ("matmul", "__matmul__", "mm", "bmm")),
         F.conv_transpose1d: _conv_transpose(F.conv_transpose1d), F.conv_transpose2d: _conv_transpose(F.conv_transpose2d),
         F.conv_transpose3d: _conv_transpose(F.conv_transpose3d)})
