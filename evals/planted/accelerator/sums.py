"""fp32 sums as CUDA's reduce and scan kernels add: lanes, then a tree; blocks, then a carried total. The
reductions and the gradients of broadcast operands are built on them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from evals.planted.accelerator.numerics import (
    F32,
)

THREADS = 512  # lanes of a CUDA block: each adds its strided elements in turn, then the block adds in a tree
SCAN_BLOCK = 64  # a scan's block: a tree scan inside, the running total carried from block to block


def fp32_sum(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """fp32 sum over `dims` (removed) with an fp32 accumulator, as CUDA's reduce kernel: element i of a row
    goes to lane i % THREADS, each lane adds its elements in order, then the lanes are added in a tree."""
    x = x.float()
    if not dims:
        return x.clone()
    keep = [d for d in range(x.dim()) if d not in dims]
    kept = [x.shape[d] for d in keep]
    if x.numel() == 0:
        return torch.zeros(kept, dtype=F32)
    flat = x.permute(keep + dims).reshape(kept + [-1])
    n = flat.shape[-1]
    lanes = min(THREADS, n)
    steps = -(-n // lanes)
    flat = F.pad(flat, (0, steps * lanes - n))
    grid = flat.reshape(kept + [steps, lanes])
    acc = grid[..., 0, :]
    for k in range(1, steps):
        acc = acc + grid[..., k, :]
    while acc.shape[-1] > 1:
        half = (acc.shape[-1] + 1) // 2
        acc = F.pad(acc, (0, 2 * half - acc.shape[-1]))
        acc = acc[..., :half] + acc[..., half:]
    return acc[..., 0]


def fp32_scan(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Inclusive fp32 prefix sum along dim: a tree (Hillis-Steele) scan inside blocks of SCAN_BLOCK, each block
    then offset by the running total of those before it, all in fp32."""
    moved = x.float().movedim(dim, -1)
    n = moved.shape[-1]
    if n == 0 or moved.numel() == 0:
        return moved.clone().movedim(-1, dim)
    blocks = -(-n // SCAN_BLOCK)
    s = F.pad(moved, (0, blocks * SCAN_BLOCK - n)).reshape(*moved.shape[:-1], blocks, SCAN_BLOCK)
    off = 1
    while off < SCAN_BLOCK:
        s = torch.cat([s[..., :off], s[..., off:] + s[..., :-off]], -1)
        off *= 2
    out = torch.empty_like(s)
    carry = torch.zeros(s.shape[:-2] + (1,), dtype=F32)
    for j in range(blocks):
        out[..., j, :] = s[..., j, :] + carry
        carry = out[..., j, -1:]
    return out.reshape(*moved.shape[:-1], -1)[..., :n].movedim(-1, dim)


def sum_to(t: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """The gradient `t` of a broadcast operand summed to its `shape` with an fp32 accumulator, in `dtype`."""
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and t.shape[lead + i] != 1]
    return fp32_sum(t, dims).reshape(shape).to(dtype)
