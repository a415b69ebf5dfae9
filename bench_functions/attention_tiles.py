"""The tiled flash-attention kernel behind bench_functions/attention.py: forward and backward over
(batch, query range, key range) segments, blocks of BLOCK_Q x BLOCK_K with an online softmax, and the
autograd Function that keeps only Q, K, V, pse, O and the row log-sum-exp (peak memory O(S * D)).

Sources: see bench_functions/attention.py ([FA]: torch_npu.npu_fusion_attention's documentation).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import BenchUnsupported

# Tile sizes: a (N, BLOCK_Q, BLOCK_K) float64 score block is 16 MiB for N=8; tests shrink them.
BLOCK_Q = 256
BLOCK_K = 1024
ALIBI_ROWS = 1024  # [FA] 参数说明 pse: compressed alibi = ori_pse[:, :, -1024:, :]
NEG_INF = float("-inf")


@dataclass(frozen=True)
class Segment:
    """One (batch, query range, key range) attention problem and the keep-rule of its mask."""

    batch: int
    q0: int
    sq: int
    k0: int
    sk: int
    mask: torch.Tensor | None = None  # (1 | N1, sq, sk) bool, True = masked (an explicit atten_mask)
    lo: int | None = None  # keep (i, j) iff lo <= j - i <= hi ...
    hi: int | None = None
    prefix: int | None = None  # ... or j < prefix (prefix modes 5/6)
    pse_kind: str = ""  # "" no pse, "full" (R = Sq), "row" (R = 1), "alibi" (R = 1024 < Sq)


@dataclass
class Plan:
    """Everything the tiled kernel needs besides the tensors."""

    n1: int
    n2: int
    scale: float
    pse_type: int
    segments: list[Segment] = field(default_factory=list)
    # The dtype a sound flash kernel rounds the probabilities to (its inputs' 16-bit dtype), or None:
    # P before the product with V and, in the backward, P recomputed before dV and dS (dS stays in the
    # work dtype), and rowsum(dO * O) moved by the size of the stored output's rounding (`rounded` in
    # api_specs/bench_functions.yaml).
    rounding: torch.dtype | None = None

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """x rounded to `rounding` (kept in its own dtype), or x itself."""
        return x if self.rounding is None else x.to(self.rounding).to(x.dtype)

    def delta_rounding(self, out: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
        """How far a sound kernel's rowsum(dO * O) moves when it reads O as stored, rounded to
        `rounding`: half an ULP of each element of O, summed in quadrature over the row (the size of
        that rounding, not one draw of it: one draw may vanish in a row where another kernel's does not).
        """
        assert self.rounding is not None
        stored = out.to(self.rounding).abs()
        unit = (torch.nextafter(stored, torch.full_like(stored, float("inf"))) - stored).to(out.dtype)
        return 0.5 * (dout * unit).square().sum(-1).sqrt()


def kept_block(seg: Segment, i0: int, i1: int, j0: int, j1: int, device: torch.device) -> torch.Tensor | None:
    """Bool (1 | N1, bq, bk) block of kept positions, or None when the whole segment is kept."""
    keep = None
    if seg.lo is not None or seg.hi is not None:
        i = torch.arange(i0, i1, device=device).view(-1, 1)
        j = torch.arange(j0, j1, device=device).view(1, -1)
        d = j - i
        keep = torch.ones_like(d, dtype=torch.bool)
        if seg.lo is not None:
            keep &= d >= seg.lo
        if seg.hi is not None:
            keep &= d <= seg.hi
        if seg.prefix is not None:
            keep |= j < seg.prefix
    if seg.mask is not None:
        given = ~seg.mask[:, i0:i1, j0:j1].to(device)
        keep = given if keep is None else keep & given
    return keep


def _alibi_index(seg: Segment, i0: int, i1: int, j0: int, j1: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each (i, j) of the full alibi bias lives in its last-1024-row compression.

    Rows i >= Sq-1024 are stored as they are; alibi depends on j - i only, so an earlier row reads the
    last stored row at column j - i + Sq - 1 (exact wherever j <= i, the only part a causal mask keeps).
    """
    off = seg.sq - ALIBI_ROWS
    i = torch.arange(i0, i1, device=device).view(-1, 1)
    j = torch.arange(j0, j1, device=device).view(1, -1)
    direct = i >= off
    rows = torch.where(direct, i - off, ALIBI_ROWS - 1).expand(i1 - i0, j1 - j0)
    cols = torch.where(direct, j, (j - i + seg.sq - 1).clamp(0, seg.sk - 1))
    return rows, cols


def _pse_block(pse: torch.Tensor, seg: Segment, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
    p = pse[seg.batch if pse.shape[0] > 1 else 0]  # (Np, R, Skv)
    if seg.pse_kind == "full":
        return p[:, i0:i1, j0:j1]
    if seg.pse_kind == "row":
        return p[:, :, j0:j1]
    rows, cols = _alibi_index(seg, i0, i1, j0, j1, pse.device)
    return p[:, rows, cols]


def _pse_grad(dpse: torch.Tensor, seg: Segment, i0: int, i1: int, j0: int, j1: int, g: torch.Tensor) -> None:
    """Accumulate a (N1, bq, bk) score gradient into dpse, summing over whatever pse broadcasts."""
    d = dpse[seg.batch if dpse.shape[0] > 1 else 0]
    if d.shape[0] == 1:
        g = g.sum(0, keepdim=True)
    if seg.pse_kind == "full":
        d[:, i0:i1, j0:j1] += g
    elif seg.pse_kind == "row":
        d[:, :, j0:j1] += g.sum(1, keepdim=True)
    else:
        rows, cols = _alibi_index(seg, i0, i1, j0, j1, dpse.device)
        d.view(d.shape[0], -1).index_add_(1, (rows * d.shape[2] + cols).flatten(), g.reshape(g.shape[0], -1))


def _scores(qt: torch.Tensor, k: torch.Tensor, pse: torch.Tensor | None, plan: Plan, seg: Segment,
            i0: int, i1: int, j0: int, j1: int) -> torch.Tensor | None:
    """Scaled, biased, masked scores (N1, bq, bk) of one block; None when the mask removes all of it."""
    keep = kept_block(seg, i0, i1, j0, j1, qt.device)
    if keep is not None:
        if not bool(keep.any()):
            return None
        keep = None if bool(keep.all()) else keep  # blocks inside the band need no masking
    s = torch.bmm(qt, k[:, seg.k0 + j0:seg.k0 + j1].transpose(1, 2)).view(plan.n1, i1 - i0, j1 - j0)
    if pse is None:
        s = s * plan.scale
    elif plan.pse_type == 1:  # [FA] 功能说明 / [V2] pse_type 1: Softmax(Mask(scale * (pse + Q K^T)))
        s = (s + _pse_block(pse, seg, i0, i1, j0, j1)) * plan.scale
    else:  # [V2] pse_type 0: scale * (Q K^T) + pse
        s = s * plan.scale + _pse_block(pse, seg, i0, i1, j0, j1)
    return s if keep is None else s.masked_fill(~keep, NEG_INF)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pse: torch.Tensor | None,
           plan: Plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward. q (N1, Tq, D), k (N2, Tk, D), v (N2, Tk, Dv) -> out (N1, Tq, Dv), row max, row sum of exp."""
    n1, n2, tq, d, dv = plan.n1, plan.n2, q.shape[1], q.shape[2], v.shape[2]
    g = n1 // n2
    out, row_max, row_sum = q.new_zeros(n1, tq, dv), q.new_full((n1, tq), NEG_INF), q.new_zeros(n1, tq)
    qg = q.view(n2, g, tq, d)
    for seg in plan.segments:
        for i0 in range(0, seg.sq, BLOCK_Q):
            i1 = min(i0 + BLOCK_Q, seg.sq)
            bq, rows = i1 - i0, slice(seg.q0 + i0, seg.q0 + i1)
            qt = qg[:, :, rows].reshape(n2, g * bq, d)
            m, ell, acc = q.new_full((n1, bq), NEG_INF), q.new_zeros(n1, bq), q.new_zeros(n1, bq, dv)
            for j0 in range(0, seg.sk, BLOCK_K):
                j1 = min(j0 + BLOCK_K, seg.sk)
                s = _scores(qt, k, pse, plan, seg, i0, i1, j0, j1)
                if s is None:
                    continue
                m_new = torch.maximum(m, s.amax(-1))
                shift = m_new.masked_fill(m_new == NEG_INF, 0.0)  # rows with nothing kept yet stay at 0
                alpha = torch.exp(m - shift)
                p = torch.exp(s - shift.unsqueeze(-1))
                ell = ell * alpha + p.sum(-1)
                pv = torch.bmm(plan.round(p).view(n2, g * bq, j1 - j0), v[:, seg.k0 + j0:seg.k0 + j1])
                acc = acc * alpha.unsqueeze(-1) + pv.view(n1, bq, dv)
                m = m_new
            out[:, rows], row_max[:, rows], row_sum[:, rows] = acc / ell.unsqueeze(-1), m, ell
    if bool((row_sum == 0).any()):
        raise BenchUnsupported("npu_fusion_attention: some query rows have every key masked; torch_npu does not "
                               "document the output of such fully masked rows (inner_precise 'invalid rows')")
    return out, row_max, row_sum


def attend_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pse: torch.Tensor | None, out: torch.Tensor,
                    lse: torch.Tensor, dout: torch.Tensor, plan: Plan,
                    want_dpse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Flash-attention backward: each block's probabilities are recomputed from Q, K and the row log-sum-exp."""
    n1, n2, tq, d, dv_dim = plan.n1, plan.n2, q.shape[1], q.shape[2], v.shape[2]
    g = n1 // n2
    dout = dout.contiguous()
    delta = (dout * out).sum(-1)  # rowsum(dO * O) = rowsum(P * dP)
    if plan.rounding is not None:
        delta = delta + plan.delta_rounding(out, dout)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dpse = torch.zeros_like(pse) if want_dpse and pse is not None else None
    qg, dog, dqg = q.view(n2, g, tq, d), dout.view(n2, g, tq, dv_dim), dq.view(n2, g, tq, d)
    pse_factor = plan.scale if plan.pse_type == 1 else 1.0
    for seg in plan.segments:
        for i0 in range(0, seg.sq, BLOCK_Q):
            i1 = min(i0 + BLOCK_Q, seg.sq)
            bq, rows = i1 - i0, slice(seg.q0 + i0, seg.q0 + i1)
            qt = qg[:, :, rows].reshape(n2, g * bq, d)
            dot = dog[:, :, rows].reshape(n2, g * bq, dv_dim)
            dqt = torch.zeros_like(qt)
            lse_t, delta_t = lse[:, rows].unsqueeze(-1), delta[:, rows].unsqueeze(-1)
            for j0 in range(0, seg.sk, BLOCK_K):
                j1 = min(j0 + BLOCK_K, seg.sk)
                s = _scores(qt, k, pse, plan, seg, i0, i1, j0, j1)
                if s is None:
                    continue
                cols, bk = slice(seg.k0 + j0, seg.k0 + j1), j1 - j0
                p = plan.round(torch.exp(s - lse_t))  # masked positions: exp(-inf) = 0
                dv[:, cols] += torch.bmm(p.view(n2, g * bq, bk).transpose(1, 2), dot)
                dp = torch.bmm(dot, v[:, cols].transpose(1, 2)).view(n1, bq, bk)
                ds = p * (dp - delta_t)  # gradient of the softmax input
                if dpse is not None:
                    _pse_grad(dpse, seg, i0, i1, j0, j1, ds * pse_factor)
                draw = (ds * plan.scale).view(n2, g * bq, bk)
                dqt += torch.bmm(draw, k[:, cols])
                dk[:, cols] += torch.bmm(draw.transpose(1, 2), qt)
            dqg[:, :, rows] = dqt.view(n2, g, bq, d)
    return dq, dk, dv, dpse


class Tiled(torch.autograd.Function):
    """Autograd keeps only Q, K, V, pse, O and two row statistics; the backward recomputes the blocks."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pse: torch.Tensor | None,
                plan: Plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, row_max, row_sum = attend(q, k, v, pse, plan)
        ctx.save_for_backward(q, k, v, pse, out, row_max + torch.log(row_sum))
        ctx.plan = plan
        ctx.mark_non_differentiable(row_max, row_sum)
        return out, row_max, row_sum

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        q, k, v, pse, out, lse = ctx.saved_tensors
        dq, dk, dv, dpse = attend_backward(q, k, v, pse, out, lse, dout, ctx.plan, ctx.needs_input_grad[3])
        return dq, dk, dv, dpse, None
