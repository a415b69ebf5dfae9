"""What an arm is: a named set of replacements for torch functions, armed inside the device-call boundary.

The bottom of the planted-bug suite, importing nothing of it: `arms.py` (CPU-style bugs and variants) and
`accelerator/` (kernels that compute as CUDA's do) build arms from it, `registry.py` finds them by name and
`mode.py` arms one; the plugin and the scripts sit above them all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

Impl = Callable[..., Any]


@dataclass
class Arm:
    name: str
    kind: str  # "bug", "variant", or "unsupported" (the device has no kernel: a skip is the right outcome)
    what: str  # the kind of bug or variant, for the table
    impls: dict[Any, Impl]
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)


def torch_forms(impl: Impl, names: tuple[str, ...], where: tuple[Any, ...] = (torch, torch.Tensor)) -> dict[Any, Impl]:
    """`impl` for every form of the named functions that exists: torch.NAME and torch.Tensor.NAME."""
    return {getattr(m, n): impl for m in where for n in names if hasattr(m, n)}
