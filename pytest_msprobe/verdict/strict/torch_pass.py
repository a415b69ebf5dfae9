"""The strict checks' pass over one output in torch ops, on the device where the output already lives.

The strict pass's torch backend (backends.py). The same statistics as the compiled host pass
(numba_kernel.strict_blocks), operation by operation in the same work dtype (float32 for 16-bit outputs, float64
else), over the same blocks of whole rows (rules.plan), so that the bias test samples the same groups. Several of strict's blocks are done at a
time (a *chunk*), so that memory stays bounded on a huge output and each torch call covers enough
elements on an accelerator. Every total stays on the device until the end: one copy of the scalar
statistics and of the bias test's group sums comes back, and the caller reads the worst elements'
values by index.

What differs from the host pass is the order of the summations (torch's own reduction order, not
numpy's pairwise one): sums, means and the bias test's group sums agree to about 1e-12 relative, maxima,
positions and counts exactly where no summed value enters them (the scale of reductions and
contractions holds a row's RMS and the floor from the bench's mean square, both sums).

Imported on the first check that runs on the device (torch is loaded by then), never at collection.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..grid import work_dtype
from .rules import (
    P_ACC,
    P_EMIN,
    P_EST,
    P_FLOOR,
    P_GROSS,
    P_ROW,
    P_TORCH,
    P_ULP,
    P_WINDOW,
    ROW_KINDS,
    Plan,
    Totals,
    params,
    plan,
    totals_of,
)

# elements per chunk: a few MB of temporaries per buffer on a CPU, tens of MB on an accelerator
CHUNK = {"cpu": 1 << 18}
CHUNK_ACCELERATOR = 1 << 22
_WORK = {np.float32: torch.float32, np.float64: torch.float64}
_ROUND = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16, "torch.float32": torch.float32,
          "torch.float64": torch.float64}


# accelerator types the pass failed on in this process ({type: why}): their checks run on the host from then on
UNSUPPORTED: dict[str, str] = {}


def unsupported(device: torch.device, exc: BaseException) -> None:
    """Note that the pass failed on `device` (an op it lacks, such as float64 sums on some NPUs, or memory),
    warn once, and re-raise on the CPU, where every op exists and a failure is a bug."""
    if device.type == "cpu":
        raise exc
    if device.type not in UNSUPPORTED:
        lines = str(exc).strip().splitlines()
        UNSUPPORTED[device.type] = lines[0] if lines else type(exc).__name__
        warnings.warn(f"strict checks on {device.type} failed ({UNSUPPORTED[device.type]}): they run on the host "
                      "for the rest of this process (the same verdicts)", RuntimeWarning, stacklevel=2)


def sum_of_squares(values: torch.Tensor) -> float:
    """sum(values**2) in float64, a chunk at a time (rules.plan's floor of reductions and contractions); no
    copy of the whole output."""
    step = CHUNK.get(values.device.type, CHUNK_ACCELERATOR)
    total = torch.zeros((), dtype=torch.float64, device=values.device)
    for start in range(0, values.numel(), step):
        part = values[start:start + step].to(torch.float64)
        total += torch.dot(part, part)
    return float(total)


def judge_blocks(flat: dict[str, Any], row: int, device_dtype: str, rules: Mapping[str, Any], kind: str) -> Totals:
    """The totals of every block of whole rows of tensors that live on one device (a RuntimeError where the device
    lacks an op the pass needs: backends.judge_blocks then judges on the host)."""
    blocks = plan(flat, row, rules, kind, sum_of_squares)
    got, sums, sizes = strict_pass(flat, device_dtype, kind, blocks, params(blocks.floor, rules, device_dtype, 0.0),
                                   work_dtype(device_dtype))
    return totals_of(got, sums, sizes)


def strict_pass(flat: dict[str, torch.Tensor], device_dtype: str, kind: str, blocks: Plan, params: np.ndarray,
                work: type[np.floating[Any]]) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """The totals of numba_kernel.strict_blocks over tensors that live on one device, in the same blocks
    (rules.plan) with the same parameters (rules.params) in the same work dtype: ({total: value}, the bias
    test's group sums (4 x groups), the groups' sizes), on the host."""
    dev = flat["d"].device
    pass_ = _Pass(flat, device_dtype, kind, blocks, params, _WORK[work])
    m = flat["d"].numel()
    block = blocks.block
    step = block * max(1, CHUNK.get(dev.type, CHUNK_ACCELERATOR) // block)
    for start in range(0, m, step):
        pass_.chunk(start, min(start + step, m))
    return pass_.totals()


class _Pass:
    """The running totals of one output's pass, as 0-d tensors on the device (no copy back per chunk)."""

    def __init__(self, flat: dict[str, torch.Tensor], device_dtype: str, kind: str, blocks: Plan, params: np.ndarray,
                 work: torch.dtype) -> None:
        dev = flat["d"].device
        self.flat, self.size, self.block, self.every, self.work, self.dev = flat, blocks.size, blocks.block, \
            blocks.every, work, dev
        self.device_dtype, self.kind = device_dtype, kind

        def const(value: float) -> torch.Tensor:  # a parameter rounded to the work dtype, as the host pass does
            with np.errstate(over="ignore"):  # rounded on the host (beyond float32: inf), filled there
                rounded = float(np.float32(value) if work == torch.float32 else np.float64(value))
            return torch.full((), rounded, dtype=work, device=dev)

        p = [float(x) for x in params]
        self.floor, self.c_torch, self.c_acc = const(p[P_FLOOR]), const(p[P_TORCH]), const(p[P_ACC])
        self.c_gross, self.emin, self.step = const(p[P_GROSS]), const(p[P_EMIN]), const(p[P_ULP])
        self.c_window, self.row_factor, self.est_factor = const(p[P_WINDOW]), p[P_ROW], p[P_EST]
        self.zero, self.one, self.half = const(0.0), const(1.0), const(0.5)
        self.has_floor = p[P_FLOOR] != 0.0
        zero64 = torch.zeros((), dtype=torch.float64, device=dev)
        zero_i = torch.zeros((), dtype=torch.int64, device=dev)
        # the totals of rules.Totals; further statistics slot in as further entries
        self.acc: dict[str, torch.Tensor] = {
            "sum_w": zero64.clone(), "sum_t": zero64.clone(), "max_t": zero64.clone(),
            "max_w": torch.full((), -1.0, dtype=torch.float64, device=dev), "worst": zero_i.clone(),
            "gross": zero_i.clone(), "wrong": zero_i.clone(), "first_wrong": torch.full_like(zero_i, -1),
            "wrong_zero": zero_i.clone(), "wrong_up": zero_i.clone(), "off_tie": zero_i.clone()}
        self.bias: list[torch.Tensor] = []  # per sampled block: (4, groups) group sums
        self.counts: list[torch.Tensor] = []

    def _load(self, key: str, s: slice) -> torch.Tensor | None:
        values = self.flat.get(key)
        return None if values is None else values[s].to(self.work)

    def _ulp(self, values: torch.Tensor) -> torch.Tensor:
        """grid.ulp in the work dtype: the exponent bits, at least 2**emin, times 2**-mantissa."""
        if values.dtype == torch.float32:
            binade = (values.view(torch.int32) & 0x7F800000).view(torch.float32)
        else:
            binade = (values.view(torch.int64) & 0x7FF0000000000000).view(torch.float64)
        return torch.maximum(binade, self.emin) * self.step

    def _unflush(self, values: torch.Tensor, b: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
        """A zero where |bench| lies below the dtype's normal range is the correctly rounded bench."""
        return torch.where((values == self.zero) & (b.abs() < self.emin), rounded, values)

    def _group_sums(self, values: torch.Tensor) -> torch.Tensor:
        """float64 sums of consecutive groups of `size` elements (the last may be shorter)."""
        n, size = values.numel(), self.size
        full = n // size
        sums = values[:full * size].reshape(full, size).sum(1, dtype=torch.float64)
        if n % size:
            sums = torch.cat([sums, values[full * size:].sum(dtype=torch.float64).reshape(1)])
        return sums

    def _per_element(self, groups: torch.Tensor, n: int) -> torch.Tensor:
        """Each group's value repeated over its elements."""
        return groups.repeat_interleave(self.size)[:n]

    def chunk(self, start: int, stop: int) -> None:
        """Whole blocks of rules.plan from `start` (a multiple of the block) to `stop`."""
        s, n, acc = slice(start, stop), stop - start, self.acc
        b = self._load("b", s)
        d = self._load("d", s)
        assert b is not None and d is not None
        rounded = b.to(_ROUND[self.device_dtype]).to(self.work)
        d = self._unflush(d, b, rounded)
        t = self._load("t", s)
        has_t = t is not None
        t = self._unflush(t, b, rounded) if t is not None else rounded
        unit = self._ulp(rounded)
        scale = torch.maximum(unit, self.floor) if self.has_floor else unit
        err_t = (t - b).abs() if has_t else t
        if has_t:
            scale = torch.maximum(scale, self.c_torch * err_t)
            if self.kind in ROW_KINDS:
                rms = torch.sqrt(self._group_sums(err_t.to(torch.float64).square()) / self._group_counts(n))
                scale = torch.maximum(scale, self._per_element((self.row_factor * rms).to(self.work), n))
                est = self.flat.get("est")
                if est is not None:
                    r_est = self._per_element((self.est_factor * rms).to(self.work), n)
                    scale = torch.where(est[s], torch.maximum(scale, r_est), scale)
        mag = self._load("mag", s)
        if mag is not None:
            scale = torch.maximum(scale, self.c_acc * mag.abs())
        prod = self._load("prod", s)
        if prod is not None:
            scale = torch.maximum(scale, self._ulp(prod))
        w = (d - b).abs() / scale * torch.where(d != rounded, self.one, self.zero)
        acc["gross"] += (w > self.c_gross).sum()
        self._worst(w, start)
        acc["sum_w"] += w.sum(dtype=torch.float64)
        if has_t:
            w_t = err_t / scale * torch.where(t != rounded, self.one, self.zero)
            acc["sum_t"] += w_t.sum(dtype=torch.float64)
            top = w_t.max().to(torch.float64)
            acc["max_t"] = torch.where(top > acc["max_t"], top, acc["max_t"])  # a NaN maximum leaves it
        if self.kind == "exact":
            self._exact(b, d, t, rounded, unit, start)
        self._bias(b, d, t, rounded, unit, start)

    def _group_counts(self, n: int) -> torch.Tensor:
        counts = torch.full((-(-n // self.size),), float(self.size), dtype=torch.float64, device=self.dev)
        if n % self.size:
            counts[-1] = float(n % self.size)
        return counts

    def _worst(self, w: torch.Tensor, start: int) -> None:
        """The first largest normalised error of the output, strict's blocks in order: a block's maximum
        replaces the running one where it is larger, and a block holding NaN changes nothing (the host
        pass's argmax finds the NaN, which is not larger)."""
        acc, block = self.acc, self.block
        n = w.numel()
        blocks = -(-n // block)
        rows = torch.nn.functional.pad(w, (0, blocks * block - n), value=-1.0).reshape(blocks, block)
        tops, index = rows.max(1)
        tops = torch.where(torch.isnan(rows).any(1), -torch.inf, tops).to(torch.float64)
        best = torch.argmax(tops)  # the first block of the largest maximum: later equal ones do not replace it
        better = tops[best] > acc["max_w"]
        acc["max_w"] = torch.where(better, tops[best], acc["max_w"])
        acc["worst"] = torch.where(better, start + best * block + index[best], acc["worst"])

    def _exact(self, b: torch.Tensor, d: torch.Tensor, t: torch.Tensor, rounded: torch.Tensor, unit: torch.Tensor,
               start: int) -> None:
        """Wrongly rounded elements: how many, which way, away from a tie, and the first of them."""
        acc, has_t = self.acc, "t" in self.flat
        bad = (d != rounded) & (d != t) if has_t else d != rounded
        acc["wrong"] += bad.sum()
        acc["wrong_zero"] += (bad & (d.abs() < rounded.abs())).sum()
        acc["wrong_up"] += (bad & (d > rounded)).sum()
        acc["off_tie"] += (bad & (((b - rounded).abs() / unit - self.half).abs() > self.c_window)).sum()
        first = torch.argmax(bad.to(torch.uint8)) + start
        take = (acc["first_wrong"] < 0) & bad.any()
        acc["first_wrong"] = torch.where(take, first, acc["first_wrong"])

    def _bias(self, b: torch.Tensor, d: torch.Tensor, t: torch.Tensor, rounded: torch.Tensor, unit: torch.Tensor,
              start: int) -> None:
        """The bias test's group sums over the blocks it samples (every `every`-th of the output, from its
        first), block by block in order; a block holds whole groups."""
        block, every, n = self.block, self.every, b.numel()
        blocks = -(-n // block)
        first = (-(start // block)) % every
        if first >= blocks:
            return
        full = n // block
        if full > first:
            picked = range(first, full, every)

            def sampled(x: torch.Tensor) -> torch.Tensor:
                return x[:full * block].reshape(full, block)[first::every].reshape(-1)

            self._bias_of(sampled(b), sampled(d), sampled(t), sampled(rounded), sampled(unit), len(picked) * block)
        last = blocks - 1
        if n % block and last >= first and (last - first) % every == 0:  # a shorter last block, sampled
            s = slice(last * block, n)
            self._bias_of(b[s], d[s], t[s], rounded[s], unit[s], n - last * block)

    def _bias_of(self, b: torch.Tensor, d: torch.Tensor, t: torch.Tensor, rounded: torch.Tensor,
                 unit: torch.Tensor, n: int) -> None:
        """Signed errors in ULPs from the correctly rounded result, clipped to +-1, summed per group."""
        towards_zero = torch.where(torch.isnan(b), b, -torch.sign(b))  # numpy's sign keeps NaN
        signed_d = torch.clamp((d - rounded) / unit, -self.one, self.one)
        signed_t = torch.clamp((t - rounded) / unit, -self.one, self.one)
        self.bias.append(torch.stack([self._group_sums(x) for x in (signed_d, signed_t, signed_d * towards_zero,
                                                                       signed_t * towards_zero)]))
        self.counts.append(self._group_counts(n).to(torch.int64))  # blocks hold whole groups

    def totals(self) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
        """The totals on the host: one copy of the scalars and one of the group sums."""
        keys = list(self.acc)
        scalars = torch.stack([self.acc[k].to(torch.float64) for k in keys]).cpu().tolist()
        sums = torch.cat(self.bias, 1).cpu().numpy() if self.bias else np.empty((4, 0))
        counts = torch.cat(self.counts).cpu().numpy() if self.counts else np.empty(0, dtype=np.int64)
        return dict(zip(keys, scalars)), sums, counts
