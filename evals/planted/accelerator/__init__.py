"""Correct kernels that compute as CUDA's do, one module per family of kernels (`self_check.py` holds them to
their contracts). ACCELERATOR_ARMS lists them in the order the tables print them."""
from __future__ import annotations

from evals.planted.accelerator import contractions, fma, gradients, maths, ordering, reductions, unsupported
from evals.planted.arm import Arm

ACCELERATOR_ARMS: list[Arm] = [
    maths.CUDA_SINCOS,
    maths.CUDA_MATH,
    gradients.CUDA_BROADCAST_GRAD,
    gradients.CUDA_EMBEDDING_BACKWARD,
    fma.CUDA_FMA_OPTIMIZER,
    reductions.CUDA_REDUCTIONS,
    contractions.CUDA_CONTRACTIONS,
    ordering.TIES_AND_DUPLICATES,
    unsupported.NOT_IMPLEMENTED,
]
