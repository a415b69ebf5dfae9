"""Where the bench, the third run and the magnitude run compute (msprobe_bench_device), and in what.

The bench must be far more accurate than the output it judges. A 16-bit output's bench in fp32 is: on any device
whose fp32 arithmetic is IEEE (a GPU's with TF32 off, an NPU's with HF32 off), its error is a few fp32 ULPs of each
partial result, 2**-24 relative per operation, against a bf16 ULP of 2**-8 (fp16: 2**-11): orders of magnitude
below what is judged, whatever order the device sums in. An fp32 output's bench in fp32 is not: its own error is
of the size of the error being judged, so its bench is fp64, which a GPU computes (slowly, but exactly as IEEE
says) and an NPU does not have: there the bench of fp32 outputs runs in fp64 on the CPU.

TF32 (CUDA's matmul and cuDNN's convolutions) and HF32 (Ascend's) read 10 mantissa bits of fp32 inputs: a bench
computed so would be no better than a bf16 kernel. They are switched off while a bench runs there, and put back.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

NO_FP64 = ("npu",)  # device kinds without fp64 arithmetic: their fp64 benches run on the CPU


def placement(requested: str, raise_to: torch.dtype | None, dtypes: list[torch.dtype]) -> str:
    """The torch device the bench of this call runs on: `requested` (cpu, cuda:N, npu:N), or the CPU where it
    would compute in fp64 (`raise_to`, or an fp64 input kept as it is) and `requested` has no fp64."""
    kind = requested.split(":")[0]
    wide = raise_to == torch.float64 or (raise_to is None and torch.float64 in dtypes)
    return "cpu" if kind in NO_FP64 and wide else requested


def describe(device: str, raise_to: torch.dtype | None) -> str:
    """How the bench ran, for the record and the failure text: `cuda:0 (fp32, TF32 off)`."""
    precision = {torch.float32: "fp32", torch.float64: "fp64"}.get(raise_to, "recorded dtype") \
        if raise_to is not None else "recorded dtype"
    kind = device.split(":")[0]
    off = {"cuda": ", TF32 off", "npu": ", HF32 off"}.get(kind, "")
    return f"{device} ({precision}{off})"


@contextmanager
def ieee_fp32(device: str) -> Iterator[None]:
    """TF32 (cuda) or HF32 (npu) off while the block runs there; the user's settings put back after."""
    kind = device.split(":")[0]
    saved: list[tuple[Any, str, Any]] = []
    if kind == "cuda":
        saved = [(torch.backends.cuda.matmul, "allow_tf32", False), (torch.backends.cudnn, "allow_tf32", False)]
    elif kind == "npu":
        npu = getattr(torch, "npu", None)
        saved = [(getattr(npu, part), "allow_hf32", False) for part in ("matmul", "conv")
                 if npu is not None and hasattr(getattr(npu, part, None), "allow_hf32")]
    before = [(node, attr, getattr(node, attr)) for node, attr, _ in saved]
    try:
        for node, attr, value in saved:
            setattr(node, attr, value)
        yield
    finally:
        for node, attr, value in before:
            setattr(node, attr, value)
