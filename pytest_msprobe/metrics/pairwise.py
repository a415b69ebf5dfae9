"""numpy's pairwise-summation tree (numpy/_core/src/umath/loops_utils.h), walked once for every compiled pass.

numpy sums n terms by halving them (the first half a multiple of 8) down to leaves of at most 128 terms,
each added in 8 accumulators, and adds the halves back in the same order. A compiled pass that reads an
output in chunks of whole leaves takes each leaf's sum while the leaf is in cache (`leaves` lists them in
order) and rebuilds numpy's total from those sums (`combine`), bit for bit. The metric pass
(metrics/kernel.py) and the strict pass (verdict/strict_kernel.py) both use these two walks; they are
written without recursion because numba's disk cache cannot hold a recursive function.

Imported by those passes only, on the first check, never at collection.
"""
from __future__ import annotations

from typing import Any

from ..compiled import compiled

PW_BLOCK = 128  # numpy's pairwise summation: leaves of up to 128 elements, 8 accumulators each


@compiled
def max_leaves(n: int) -> int:
    """An upper bound on the leaves of n terms (every leaf but a short whole sum holds more than 32)."""
    return n // 32 + 2


@compiled
def leaves(n: int, los: Any, lens: Any, stack: Any) -> int:
    """The leaves of numpy's pairwise sum of n terms, in order, into los / lens (at least max_leaves(n)
    long); returns their number. `stack`: the caller's int64 array of 3 x 64 (so a call allocates nothing)."""
    start, size, stage = stack[0], stack[1], stack[2]
    start[0], size[0], stage[0] = 0, n, 0
    top, count = 0, 0
    while top >= 0:
        if size[top] <= PW_BLOCK:
            los[count], lens[count] = start[top], size[top]
            count += 1
            top -= 1
            while top >= 0 and stage[top] == 2:  # a right half done: its node is done
                top -= 1
            if top < 0:
                break
            stage[top] = 2  # a left half done: on to the right half
            half = size[top] // 2
            half -= half % 8
            start[top + 1], size[top + 1], stage[top + 1] = start[top] + half, size[top] - half, 0
        else:
            half = size[top] // 2
            half -= half % 8
            stage[top] = 1
            start[top + 1], size[top + 1], stage[top + 1] = start[top], half, 0
        top += 1
    return count


@compiled
def combine(n: int, sums: Any, stack: Any, left: Any) -> Any:
    """numpy's pairwise sum of n terms from its leaves' sums (in `leaves`' order): the same tree, added
    back in the same order, in the dtype of `left` (64 elements; `stack` as for `leaves`)."""
    size, stage = stack[0], stack[1]
    size[0], stage[0] = n, 0
    top, leaf = 0, 0
    while True:
        if size[top] <= PW_BLOCK:
            value = sums[leaf]
            leaf += 1
            top -= 1
            while top >= 0 and stage[top] == 2:
                value = left[top] + value
                top -= 1
            if top < 0:
                return value
            left[top], stage[top] = value, 2
            half = size[top] // 2
            half -= half % 8
            size[top + 1], stage[top + 1] = size[top] - half, 0
        else:
            half = size[top] // 2
            half -= half % 8
            stage[top] = 1
            size[top + 1], stage[top + 1] = half, 0
        top += 1
