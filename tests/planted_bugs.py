"""Correct kernels and planted precision bugs, as (bench, reference, device) arrays per case.

Used by tests/test_strict.py (detection and false-alarm targets) and benchmarks/planted_bugs.py
(prints the matrix per standard). The bench is float64 on the rounded inputs; the reference is the
same maths in fp32 (the kernel a correct device would run) rounded to the dtype; "correct" devices
use other summation orders or torch's own low-precision CPU kernels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"torch.float16": torch.float16, "torch.bfloat16": torch.bfloat16, "torch.float32": torch.float32}


@dataclass
class Case:
    api: str
    dtype: str
    kind: str  # "correct:..." or "bug:..."
    bench: np.ndarray
    reference: np.ndarray
    device: np.ndarray
    sensitivity: np.ndarray  # RMS of |reference(perturbed inputs) - reference| over 2 runs, unrounded


    @property
    def is_bug(self) -> bool:
        return self.kind.startswith("bug:")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def truncate(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round toward zero (a kernel that chops instead of rounding)."""
    x = values.double().numpy()
    if dtype == torch.bfloat16:
        bits = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
        return torch.from_numpy(bits.view(np.float32)).to(dtype)
    np_dtype = np.float16 if dtype == torch.float16 else np.float32
    r = x.astype(np_dtype)
    over = np.abs(r.astype(np.float64)) > np.abs(x)
    return torch.from_numpy(np.where(over, np.nextafter(r, np_dtype(0)), r)).to(dtype)


def _half_accumulation(dtype: torch.dtype) -> torch.dtype:
    """The accumulator of the 'accumulates in half precision' bug (bf16 for fp32 outputs)."""
    return torch.bfloat16 if dtype == torch.float32 else dtype


def _corrupt(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    flat = t.clone().reshape(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[: max(1, flat.numel() // 10000)]
    flat[idx] = (flat[idx].float() * 1.5 + 0.1).to(t.dtype)
    return flat.reshape(t.shape)


def perturb(t: torch.Tensor, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Move every element by one unit roundoff of `dtype`, in a random direction (as check.py does)."""
    signs = torch.randint(0, 2, t.shape, generator=gen, dtype=t.dtype) * 2 - 1
    return t * (1 + torch.finfo(dtype).eps / 2 * signs)


def cases(seed: int = 0, rows: tuple[int, ...] = (16, 256)) -> Iterator[Case]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo

    for dtype_name, dt in DTYPES.items():
        acc = _half_accumulation(dt)
        for n in rows:
            def emit(api: str, fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor],
                     variants: dict[str, torch.Tensor]) -> Iterator[Case]:
                bench = fn(*[t.double() for t in inputs])
                fp32 = fn(*[t.float() for t in inputs])
                runs = [fn(*[perturb(t.float(), dt, gen) for t in inputs]) - fp32 for _ in range(2)]
                sens = torch.stack(runs).double().pow(2).mean(0).sqrt()
                for kind, device in variants.items():
                    yield Case(api, dtype_name, kind, _np(bench), _np(fp32.to(dt)), _np(device.to(dt)), _np(sens))

            # linear: a reduction of length 64
            x, w = rand(n, 64, lo=-1, hi=3).to(dt), rand(96, 64, lo=-0.25, hi=0.25).to(dt)
            exact = x.double() @ w.double().T
            split = (x[:, :32].float() @ w[:, :32].float().T + x[:, 32:].float() @ w[:, 32:].float().T)
            half = torch.zeros(n, 96, dtype=acc)
            for k in range(64):
                half = (half + (x[:, k:k + 1].float() * w[:, k].float()).to(acc)).to(acc)
            yield from emit("linear", lambda a, b: a @ b.T, [x, w], {
                "correct:torch": F.linear(x, w), "correct:split-sum": split.to(dt),
                "bug:half-accumulation": half, "bug:truncate": truncate(exact, dt),
                "bug:bias-2^-10": (x.float() @ w.float().T) * (1 + 2 ** -10),
                "bug:corrupt-1e-4": _corrupt((x.float() @ w.float().T).to(dt), gen),
            })
            # sum over 1000 elements (long reduction with cancellation)
            s = rand(n, 1000).to(dt)
            half = torch.zeros(n, dtype=acc)
            for k in range(1000):
                half = (half + s[:, k].to(acc)).to(acc)
            yield from emit("sum", lambda a: a.sum(-1), [s], {
                "correct:torch": s.sum(-1), "correct:pairwise": (s[:, :500].float().sum(-1) + s[:, 500:].float().sum(-1)),
                "bug:half-accumulation": half,
            })
            # layer_norm: wrong epsilon
            h = rand(n, 256, lo=0.5, hi=1.5).to(dt)
            yield from emit("layer_norm", lambda a: F.layer_norm(a, (256,), eps=1e-5), [h], {
                                "correct:torch": F.layer_norm(h, (256,), eps=1e-5),
                                "bug:wrong-eps": F.layer_norm(h.float(), (256,), eps=1e-2),
                                "bug:truncate": truncate(F.layer_norm(h.double(), (256,), eps=1e-5), dt),
                            })
            # softmax: missing max-subtraction is fine numerically here; a biased exp is not
            z = rand(n, 128, lo=-4, hi=4).to(dt)
            yield from emit("softmax", lambda a: F.softmax(a, -1), [z], {
                "correct:torch": F.softmax(z, -1),
                "correct:no-max-subtraction": (z.float().exp() / z.float().exp().sum(-1, keepdim=True)),
                "bug:bias-2^-10": F.softmax(z.float(), -1) * (1 + 2 ** -10),
                "bug:corrupt-1e-4": _corrupt(F.softmax(z.float(), -1).to(dt), gen),
            })
            # gelu with a NaN input: dropping the NaN is a bug
            g = rand(n, 128, lo=-3, hi=3)
            g[0, 0] = float("nan")
            g = g.to(dt)
            dropped = F.gelu(g.float()).clone()
            dropped[0, 0] = 0.0
            yield from emit("gelu", F.gelu, [g], {
                "correct:torch": F.gelu(g), "bug:drops-nan": dropped,
                "bug:tanh-approximation": F.gelu(g.float(), approximate="tanh"),
            })


def beyond_rounding(case: Case, correct: np.ndarray) -> bool:
    """Does the bug move results by more than the dtype's rounding error (1 ULP)?

    Both against the correct kernel and against the exact result: a truncating kernel stays within
    1 ULP of the exact value, so it is a rounding-level bug and does not count here.
    """
    from pytest_msprobe.strict import round_to, ulp

    unit = ulp(round_to(case.bench, case.dtype), case.dtype)
    with np.errstate(invalid="ignore"):
        if (np.isnan(case.device) != np.isnan(correct)).any():
            return True
        return bool(np.nanmax(np.abs(case.device - correct) / unit) > 1.0
                    and np.nanmax(np.abs(case.device - case.bench) / unit) > 1.0)
