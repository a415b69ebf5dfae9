"""Flash-attention kernels for npu_fusion_attention, sound and buggy, as a kernel author writes them.

Each is a tiled online-softmax kernel with its own tile size (128 x 128, unlike the reference's
256 x 1024), fp32 scores, row max and row sum, and an autograd Function whose backward recomputes
the probabilities per tile from the saved log-sum-exp, as flash kernels (Ascend's included) do. The
argument parsing (layouts, GQA, sparse modes, TND segments) is the reference's `Call`, so the kernels
differ from it only where a kernel's numerics or a planted bug says so.

`Flavour` says what the kernel rounds and which bug it carries:
* p_dtype: probabilities rounded to the input dtype before the product with V (and dV = P^T dO);
* ds_round: dS rounded to the input dtype before the dQ and dK products (FlashAttention-2 on GPUs);
* bugs: rowsum16 (row sum accumulated in the input dtype, every 16 keys), scale_hidden (1/sqrt of
  the hidden size instead of the given scale), causal_leak (a causal mask that keeps one future
  key), gqa_modulo (query head h reads kv head h % Nkv instead of h // (Nq/Nkv)), dq_acc16 (dQ
  accumulated in the input dtype across key tiles), dk_noscale (dK without the softmax scale).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from bench_functions.attention import MAX_TOKENS, Call
from bench_functions.attention_tiles import Plan, Segment, kept_block

TILE = 128
NEG_INF = float("-inf")


@dataclass(frozen=True)
class Flavour:
    p_dtype: bool = True
    ds_round: bool = False
    bug: str = ""


def _r(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).float()


def _kv(x: torch.Tensor, plan: Plan, fl: Flavour) -> torch.Tensor:
    """kv heads (N2, T, D) -> per query head (N1, T, D)."""
    g = plan.n1 // plan.n2
    if fl.bug == "gqa_modulo" and g > 1:
        return x.repeat(g, 1, 1)  # head h -> h % N2
    return x.repeat_interleave(g, dim=0)


def _segment(seg: Segment, fl: Flavour) -> Segment:
    if fl.bug == "causal_leak" and seg.hi is not None:
        return dataclasses.replace(seg, hi=seg.hi + 1)
    return seg


def _scores(q: torch.Tensor, k: torch.Tensor, seg: Segment, scale: float, i0: int, i1: int, j0: int,
            j1: int) -> torch.Tensor | None:
    keep = kept_block(seg, i0, i1, j0, j1, q.device)
    if keep is not None and not bool(keep.any()):
        return None
    s = torch.bmm(q[:, seg.q0 + i0:seg.q0 + i1], k[:, seg.k0 + j0:seg.k0 + j1].transpose(1, 2)) * scale
    return s if keep is None else s.masked_fill(~keep, NEG_INF)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, dtype: torch.dtype, scale: float,
            fl: Flavour) -> tuple[torch.Tensor, torch.Tensor]:
    """q (N1, T, D), k, v (N1, T, D) fp32 -> out (N1, T, Dv) fp32, lse (N1, T)."""
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    lse = q.new_full(q.shape[:2], NEG_INF)
    for seg in map(lambda s: _segment(s, fl), plan.segments):
        for i0 in range(0, seg.sq, TILE):
            i1 = min(i0 + TILE, seg.sq)
            m = q.new_full((q.shape[0], i1 - i0), NEG_INF)
            ell, acc = torch.zeros_like(m), q.new_zeros(q.shape[0], i1 - i0, v.shape[2])
            for j0 in range(0, seg.sk, TILE):
                j1 = min(j0 + TILE, seg.sk)
                s = _scores(q, k, seg, scale, i0, i1, j0, j1)
                if s is None:
                    continue
                m_new = torch.maximum(m, s.amax(-1))
                shift = m_new.masked_fill(m_new == NEG_INF, 0.0)
                alpha = torch.exp(m - shift)
                p = torch.exp(s - shift.unsqueeze(-1))
                if fl.bug == "rowsum16":  # the row sum kept in the input dtype, rounded every 16 keys
                    ell = _r(ell * alpha, dtype)
                    for c in range(0, p.shape[-1], 16):
                        ell = _r(ell + p[..., c:c + 16].sum(-1), dtype)
                else:
                    ell = ell * alpha + p.sum(-1)
                pv = torch.bmm(_r(p, dtype) if fl.p_dtype else p, v[:, seg.k0 + j0:seg.k0 + j1])
                acc = acc * alpha.unsqueeze(-1) + pv
                m = m_new
            rows = slice(seg.q0 + i0, seg.q0 + i1)
            out[:, rows] = acc / ell.unsqueeze(-1)
            lse[:, rows] = m + torch.log(ell)
    return out, lse


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
             dout: torch.Tensor, plan: Plan, dtype: torch.dtype, scale: float,
             fl: Flavour) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (per query head) from the output rounded to the input dtype, as the kernel stored it."""
    delta = (dout * out).sum(-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    k_scale = 1.0 if fl.bug == "dk_noscale" else scale
    for seg in map(lambda s: _segment(s, fl), plan.segments):
        for j0 in range(0, seg.sk, TILE):  # key tiles outside, as flash backward kernels walk them
            j1 = min(j0 + TILE, seg.sk)
            cols = slice(seg.k0 + j0, seg.k0 + j1)
            for i0 in range(0, seg.sq, TILE):
                i1 = min(i0 + TILE, seg.sq)
                s = _scores(q, k, seg, scale, i0, i1, j0, j1)
                if s is None:
                    continue
                rows = slice(seg.q0 + i0, seg.q0 + i1)
                p = torch.exp(s - lse[:, rows].unsqueeze(-1))
                if fl.p_dtype:
                    p = _r(p, dtype)
                dv[:, cols] += torch.bmm(p.transpose(1, 2), dout[:, rows])
                dp = torch.bmm(dout[:, rows], v[:, cols].transpose(1, 2))
                ds = p * (dp - delta[:, rows].unsqueeze(-1))
                if fl.ds_round:
                    ds = _r(ds, dtype)
                part = torch.bmm(ds, k[:, cols]) * scale
                dq[:, rows] = _r(dq[:, rows] + part, dtype) if fl.bug == "dq_acc16" else dq[:, rows] + part
                dk[:, cols] += torch.bmm(ds.transpose(1, 2), q[:, rows]) * k_scale
    return dq, dk, dv


class _Flash(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: Call, dtype: torch.dtype,
                fl: Flavour) -> torch.Tensor:
        plan = call.plan
        scale = plan.scale
        if fl.bug == "scale_hidden":
            scale = 1.0 / math.sqrt(q.shape[-1] * plan.n1)
        qf, kf, vf = (call.heads(x, n).float() for x, n in ((q, call.n1), (k, call.n2), (v, call.n2)))
        kx, vx = _kv(kf, plan, fl), _kv(vf, plan, fl)
        out, lse = forward(qf, kx, vx, plan, dtype, scale, fl)
        stored = _r(out, dtype)
        ctx.save_for_backward(qf, kx, vx, stored, lse)
        ctx.meta = (call, dtype, scale, fl)
        return call.unheads(out, dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        qf, kx, vx, stored, lse = ctx.saved_tensors
        call, dtype, scale, fl = ctx.meta
        dout = call.heads(grad.to(dtype), call.n1).float()
        dq, dk, dv = backward(qf, kx, vx, stored, lse, dout, call.plan, dtype, scale, fl)
        g = call.n1 // call.n2
        if fl.bug == "gqa_modulo" and g > 1:
            dk, dv = (x.view(g, call.n2, *x.shape[1:]).sum(0) for x in (dk, dv))
        else:
            dk, dv = (x.view(call.n2, g, *x.shape[1:]).sum(1) for x in (dk, dv))
        return (call.unheads(dq, dtype), call.unheads(dk, dtype), call.unheads(dv, dtype), None, None, None)


def kernel(fl: Flavour) -> Any:
    """An npu_fusion_attention with this flavour (torch_npu's signature and outputs)."""

    def npu_fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                             input_layout: str, pse: Any = None, padding_mask: Any = None,
                             atten_mask: torch.Tensor | None = None, scale: float = 1.0, keep_prob: float = 1.0,
                             pre_tockens: int = MAX_TOKENS, next_tockens: int = MAX_TOKENS, inner_precise: int = 0,
                             prefix: Any = None, actual_seq_qlen: Any = None, actual_seq_kvlen: Any = None,
                             sparse_mode: int = 0, gen_mask_parallel: bool = True, sync: bool = False,
                             softmax_layout: str = "") -> tuple[Any, ...]:
        call = Call(query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask,
                    atten_mask=atten_mask, scale=scale, keep_prob=keep_prob, pre=pre_tockens, nxt=next_tockens,
                    prefix=prefix, actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                    sparse_mode=sparse_mode)
        out = _Flash.apply(query, key, value, call, query.dtype, fl)  # type: ignore[no-untyped-call]
        empty = query.new_empty(0)
        return out, empty, empty, empty, 0, 0, call.numels()

    return npu_fusion_attention


def grad_kernel(fl: Flavour) -> Any:
    """npu_fusion_attention_grad with this flavour: (dq, dk, dv, dpse)."""
    forward_kernel = kernel(fl)

    def npu_fusion_attention_grad(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dy: torch.Tensor,
                                  head_num: int, input_layout: str, *, scale_value: float = 1.0,
                                  **kwargs: Any) -> tuple[Any, ...]:
        keep = {k: v for k, v in kwargs.items() if k in ("pse", "padding_mask", "atten_mask", "keep_prob",
                                                          "pre_tockens", "next_tockens", "prefix", "actual_seq_qlen",
                                                          "actual_seq_kvlen", "sparse_mode")}
        with torch.enable_grad():
            q, k, v = (x.detach().requires_grad_(True) for x in (query, key, value))
            out = forward_kernel(q, k, v, head_num, input_layout, scale=scale_value, **keep)[0]
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), dy.to(out.dtype))
        return dq, dk, dv, None

    return npu_fusion_attention_grad
