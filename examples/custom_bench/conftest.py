"""A reference for a fused op of your own, registered from a conftest.py beside the dump.

`pytest examples/custom_bench/` loads this file, so NPU.npu_scaled_silu items run this function on
the bench (and, without an NPU, on the device side too, labelled reference-vs-reference).
"""
from __future__ import annotations

import torch

import bench_functions


@bench_functions.register("npu_scaled_silu")
def npu_scaled_silu(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """scale * x * sigmoid(x): pure torch, device-agnostic and differentiable, like every bench function."""
    return scale * x * torch.sigmoid(x)
