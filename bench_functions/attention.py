"""npu_fusion_attention (+ _grad, _v2): tiled flash-attention reference.

It computes in its inputs' dtype, float32 at least: the check decides that dtype per output dtype
(api_specs/apis.yaml, precision.raise_map_by_api: float32 for bf16 outputs, float64 otherwise).

The score matrix is never materialised: queries and keys are walked in blocks of BLOCK_Q x BLOCK_K
with an online softmax, and the backward is a custom autograd Function that recomputes each block
from Q, K and the row log-sum-exp (flash-attention style), so peak memory is O(S * D), not O(S^2).

Sources (cited next to each rule below):
[FA]  torch_npu docs, torch_npu.npu_fusion_attention (Ascend/op-plugin docs/context/
      torch_npu-npu_fusion_attention.md): 函数原型/参数说明 (defaults), 约束说明, 参考资源 (sparse modes).
[SM]  CANN docs "sparseModeOptional参数说明" (the same sparse modes, stated for the aclnn kernel).
[FAG] torch_npu.npu_fusion_attention_grad schema (scale_value=1., outputs dq, dk, dv, dpse).
[V2]  MindSpeed docs "fusion attention 对外接口" (npu_fusion_attention_v2, pse_type 0-3) and CANN
      aclnnFlashAttentionScoreV2.md 约束说明 (pseType table).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import BenchUnsupported

# Tile sizes: a (N, BLOCK_Q, BLOCK_K) float64 score block is 16 MiB for N=8; tests shrink them.
BLOCK_Q = 256
BLOCK_K = 1024
MAX_TOKENS = 2147483647  # [FA] 参数说明: pre_tockens / next_tockens default
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")  # [FA] 参数说明 input_layout
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


# ----------------------------------------------------------------------------- layouts

def to_heads(x: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    """Any layout -> (N, rows, D), rows = B*S batch-major (or T for TND)."""
    if layout == "TND":
        return x.permute(1, 0, 2)
    if layout in ("BSH", "SBH"):
        x = x.unflatten(-1, (heads, x.shape[-1] // heads))
    order = {"BSH": (2, 0, 1, 3), "SBH": (2, 1, 0, 3), "BSND": (2, 0, 1, 3), "BNSD": (1, 0, 2, 3)}[layout]
    return x.permute(order).flatten(1, 2)


def from_heads(x: torch.Tensor, layout: str, batch: int) -> torch.Tensor:
    """(N, rows, D) -> the layout; the inverse of to_heads."""
    if layout == "TND":
        return x.permute(1, 0, 2)
    x = x.unflatten(1, (batch, x.shape[1] // batch))  # (N, B, S, D)
    order = {"BSH": (1, 2, 0, 3), "SBH": (2, 1, 0, 3), "BSND": (1, 2, 0, 3), "BNSD": (1, 0, 2, 3)}[layout]
    x = x.permute(order)
    return x.flatten(2) if layout in ("BSH", "SBH") else x


def _lengths(cumulative: Sequence[int]) -> list[int]:
    """[FA] 约束说明: actual_seq_qlen is a cumulative sum; trailing zeros mark batches that do not take part."""
    out, prev = [], 0
    for c in map(int, cumulative):
        if c < prev:  # e.g. [2, 5, 9, 0, 0]: the last two batches are not computed
            break
        out.append(c - prev)
        prev = c
    return out


# ----------------------------------------------------------------------------- the call

class Call:
    """Arguments of one npu_fusion_attention call, checked and turned into a Plan."""

    def __init__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                 input_layout: str, *, pse: torch.Tensor | None, padding_mask: Any, atten_mask: torch.Tensor | None,
                 scale: float, keep_prob: float, pre: int, nxt: int, prefix: Sequence[int] | None,
                 actual_seq_qlen: Sequence[int] | None, actual_seq_kvlen: Sequence[int] | None, sparse_mode: int,
                 pse_type: int = 1) -> None:
        layout = str(input_layout).upper()
        if layout not in LAYOUTS:
            raise ValueError(f"input_layout {input_layout!r} is not one of {', '.join(LAYOUTS)}")
        if not 0 < keep_prob <= 1:  # [FA] 参数说明 keep_prob: range (0, 1]
            raise ValueError(f"keep_prob must be in (0, 1], got {keep_prob}")
        if keep_prob < 1:
            raise BenchUnsupported(f"npu_fusion_attention with keep_prob={keep_prob}: the NPU draws its dropout mask "
                                   "from its own Philox stream (seed/offset outputs), which a CPU bench cannot "
                                   "reproduce; compare with keep_prob=1 instead")
        if padding_mask is not None:
            raise BenchUnsupported("npu_fusion_attention: padding_mask is not supported by torch_npu ([FA] 参数说明)")
        if pse is not None and pse_type in (2, 3):
            raise BenchUnsupported(f"pse_type={pse_type}: the NPU generates the alibi bias internally and its exact "
                                   "form (sign, offsets, sqrt) is not documented")
        if pse_type not in (0, 1, 2, 3):  # [V2] pse_type range 0-3, default 1
            raise ValueError(f"pse_type must be 0..3, got {pse_type}")
        self.layout, self.pse = layout, pse
        self.work = torch.promote_types(query.dtype, torch.float32)
        if layout in ("BSH", "SBH"):
            n1 = int(head_num)
            d = query.shape[-1] // n1
            n2 = key.shape[-1] // d if d else 0
            self.batch = query.shape[0] if layout == "BSH" else query.shape[1]
            sq, sk = (query.shape[1], key.shape[1]) if layout == "BSH" else (query.shape[0], key.shape[0])
        elif layout == "TND":
            n1, n2, self.batch = query.shape[1], key.shape[1], 0
            sq = sk = 0
        else:
            n1, n2 = (query.shape[2], key.shape[2]) if layout == "BSND" else (query.shape[1], key.shape[1])
            self.batch = query.shape[0]
            sq, sk = (query.shape[1], key.shape[1]) if layout == "BSND" else (query.shape[2], key.shape[2])
        # [FA] 约束说明: Nq/Nkv must be a non-zero integer (GQA when > 1); query head h reads kv head h // (Nq/Nkv)
        if n1 <= 0 or n2 <= 0 or n1 % n2:
            raise ValueError(f"query heads {n1} must be a positive multiple of key/value heads {n2}")
        self.n1, self.n2, self.sq, self.sk = n1, n2, sq, sk
        self.plan = Plan(n1, n2, float(scale), pse_type)
        mask = None if atten_mask is None else (atten_mask != 0)  # [FA]: 1/True = not computed
        if layout == "TND":
            self._varlen_segments(mask, pre, nxt, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
                                  query.shape[0], key.shape[0])
        else:
            self._dense_segments(mask, pre, nxt, prefix, sparse_mode)

    # -- masks

    def _rule(self, mode: int, sq: int, sk: int, pre: int, nxt: int, prefix: int | None,
              band: bool = False) -> dict[str, Any]:
        """The keep-rule of one batch for a sparse mode ([FA] 参考资源, [SM]); i = query row, j = key column."""
        if band or mode == 4:  # band, origin at the bottom-right corner
            return {"lo": -pre + sk - sq, "hi": nxt + sk - sq}
        if mode == 0:  # defaultMask: pre/next counted from the top-left corner (docs' example mask)
            return {"lo": -pre, "hi": nxt}
        if mode in (2, 8):  # leftUpCausal
            return {"hi": 0}
        if mode in (3, 7):  # rightDownCausal
            return {"hi": sk - sq}
        if mode in (5, 6):  # rightDownCausal plus the first prefix[b] columns
            if prefix is None:
                raise ValueError(f"sparse_mode {mode} needs prefix")
            return {"hi": sk - sq, "prefix": prefix}
        return {}  # allMask: the given mask only

    def _segment(self, b: int, q0: int, sq: int, k0: int, sk: int, mask: torch.Tensor | None,
                 rule: dict[str, Any]) -> Segment:
        lo, hi = rule.get("lo"), rule.get("hi")
        if lo is not None and lo <= -(sq - 1):
            lo = None  # the bound cuts nothing
        if hi is not None and hi >= sk - 1:
            hi = None
        prefix = rule.get("prefix")
        if prefix is not None and (lo is None and hi is None or prefix <= 0):
            prefix = None
        return Segment(b, q0, sq, k0, sk, mask, lo, hi, prefix, self._pse_kind(sq, sk))

    def _dense_segments(self, mask: torch.Tensor | None, pre: int, nxt: int, prefix: Sequence[int] | None,
                        mode: int) -> None:
        if not 0 <= mode <= 6:  # 7 and 8 are varlen-only ([FA] 表1)
            raise ValueError(f"sparse_mode {mode} is not supported for layout {self.layout}")
        if mask is not None and mode in (0, 1):
            if mask.dim() == 2:
                mask = mask[None, None]
            if mask.dim() != 4 or tuple(mask.shape[-2:]) != (self.sq, self.sk) or mask.shape[1] not in (1, self.n1) \
                    or mask.shape[0] not in (1, self.batch):
                raise ValueError(f"atten_mask of shape {tuple(mask.shape)} is not SS/11SS/B1SS/BNSS for "
                                 f"B={self.batch} N={self.n1} Sq={self.sq} Skv={self.sk}")
        for b in range(self.batch):
            # [FA] 约束说明: without atten_mask, sparse_mode / pre / next do not apply: full computation
            rule = {} if mask is None else self._rule(mode, self.sq, self.sk, pre, nxt,
                                                      None if prefix is None else int(prefix[b]))
            given = mask[b if mask.shape[0] > 1 else 0] if mask is not None and mode in (0, 1) else None
            self.plan.segments.append(self._segment(b, b * self.sq, self.sq, b * self.sk, self.sk, given, rule))

    def _varlen_segments(self, mask: torch.Tensor | None, pre: int, nxt: int, prefix: Sequence[int] | None,
                         actual_seq_qlen: Sequence[int] | None, actual_seq_kvlen: Sequence[int] | None, mode: int,
                         t_q: int, t_k: int) -> None:
        if actual_seq_qlen is None or actual_seq_kvlen is None:
            raise ValueError("input_layout TND needs actual_seq_qlen and actual_seq_kvlen")
        if mode == 5 or not 0 <= mode <= 8:  # [FA] 表1: prefix non-compressed is not supported for varlen
            raise ValueError(f"sparse_mode {mode} is not supported for layout TND")
        if self.pse is not None:
            raise BenchUnsupported("npu_fusion_attention TND with pse: which rows of the compressed alibi each "
                                   "varlen batch uses is not documented")
        lq, lk = _lengths(actual_seq_qlen), _lengths(actual_seq_kvlen)
        if len(lq) != len(lk):
            raise ValueError("actual_seq_qlen and actual_seq_kvlen describe different numbers of batches")
        if sum(lq) > t_q or sum(lk) > t_k:
            raise ValueError(f"actual_seq_qlen/kvlen cover {sum(lq)}/{sum(lk)} rows, query/key have {t_q}/{t_k}")
        if sum(lq) < t_q:
            raise BenchUnsupported(f"TND: actual_seq_qlen covers {sum(lq)} of {t_q} query rows; the NPU leaves the "
                                   "rows of non-participating batches undefined")
        if mask is not None and mode in (0, 1):
            if mask.dim() != 2 or mask.shape[0] < max(lq, default=0) or mask.shape[1] < max(lk, default=0):
                raise ValueError(f"TND atten_mask must be SS (maxSq, maxSkv), got {tuple(mask.shape)}")
        nonempty = [b for b, n in enumerate(lq) if n > 0]
        band_batch = nonempty[-1] if mode == 7 and nonempty else nonempty[0] if mode == 8 and nonempty else None
        q0 = k0 = 0
        for b, (sq, sk) in enumerate(zip(lq, lk)):
            if sq and not sk:
                raise BenchUnsupported(f"TND batch {b} has queries but no keys, which torch_npu does not support")
            rule = {} if mask is None else self._rule(mode, sq, sk, pre, nxt,
                                                      None if prefix is None else int(prefix[b]), b == band_batch)
            given = mask[None, :sq, :sk] if mask is not None and mode in (0, 1) else None
            self.plan.segments.append(self._segment(b, q0, sq, k0, sk, given, rule))
            q0, k0 = q0 + sq, k0 + sk

    def _pse_kind(self, sq: int, sk: int) -> str:
        """[FA] 参数说明 pse: BNSS / 1NSS ("full"), BN1Skv ("row"), or alibi compressed to its last 1024 rows."""
        pse = self.pse
        if pse is None:
            return ""
        if pse.dim() != 4 or pse.shape[0] not in (1, self.batch) or pse.shape[1] not in (1, self.n1) \
                or pse.shape[3] != sk:
            raise ValueError(f"pse of shape {tuple(pse.shape)} does not fit B={self.batch} N={self.n1} Skv={sk}")
        if pse.shape[2] == sq:
            return "full"
        if pse.shape[2] == 1:
            return "row"
        if pse.shape[2] == ALIBI_ROWS and sq > ALIBI_ROWS and sq == sk:
            return "alibi"
        raise ValueError(f"pse rows {pse.shape[2]} are neither Sq={sq}, 1, nor the compressed alibi's {ALIBI_ROWS}")

    # -- tensors

    def heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return to_heads(x.to(self.work), self.layout, n).contiguous()

    def unheads(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return from_heads(x, self.layout, self.batch).to(dtype)

    def stats(self, x: torch.Tensor, softmax_layout: str = "") -> torch.Tensor:
        """(N1, rows) row statistic -> softmax_max/sum layout, last dim 8, float32 ([FA] 输出说明)."""
        if self.layout == "TND":  # [FA] softmax_layout: NTD by default, TND when asked
            x = x.t() if str(softmax_layout).upper() == "TND" else x
        else:
            x = x.unflatten(1, (self.batch, self.sq)).permute(1, 0, 2)  # (B, N1, Sq)
        return x.unsqueeze(-1).repeat(*([1] * x.dim()), 8).float()

    def numels(self) -> int:
        return self.n1 * sum(s.sq * s.sk for s in self.plan.segments)


# ----------------------------------------------------------------------------- tiled kernel

def _keep(seg: Segment, i0: int, i1: int, j0: int, j1: int, device: torch.device) -> torch.Tensor | None:
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
    keep = _keep(seg, i0, i1, j0, j1, qt.device)
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
                pv = torch.bmm(p.view(n2, g * bq, j1 - j0), v[:, seg.k0 + j0:seg.k0 + j1])
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
                p = torch.exp(s - lse_t)  # masked positions: exp(-inf) = 0
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


class _Tiled(torch.autograd.Function):
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


# ----------------------------------------------------------------------------- torch_npu entry points

def _run(call: Call, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         softmax_layout: str = "") -> tuple[Any, ...]:
    pse = None if call.pse is None else call.pse.to(call.work)
    out, row_max, row_sum = _Tiled.apply(call.heads(query, call.n1), call.heads(key, call.n2),
                                         call.heads(value, call.n2), pse, call.plan)
    return (call.unheads(out, query.dtype), call.stats(row_max, softmax_layout), call.stats(row_sum, softmax_layout),
            query.new_empty(0), 0, 0, call.numels())  # [FA] 输出说明: softmax_out is reserved; no dropout -> seed 0


def npu_fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                         input_layout: str, pse: torch.Tensor | None = None, padding_mask: Any = None,
                         atten_mask: torch.Tensor | None = None,
                         scale: float = 1.0,  # [FA] 参数说明 scale: 默认值为1 (msprobe wrongly uses 1/sqrt(D))
                         keep_prob: float = 1.0,  # [FA] 参数说明 keep_prob: 默认值为1
                         pre_tockens: int = MAX_TOKENS, next_tockens: int = MAX_TOKENS,
                         inner_precise: int = 0, prefix: Sequence[int] | None = None,
                         actual_seq_qlen: Sequence[int] | None = None, actual_seq_kvlen: Sequence[int] | None = None,
                         sparse_mode: int = 0,  # [FA] 参数说明 sparse_mode: 默认值为0
                         gen_mask_parallel: bool = True, sync: bool = False,
                         softmax_layout: str = "") -> tuple[Any, ...]:
    """-> (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels) ([FA] 输出说明)."""
    call = Call(query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
                scale=scale, keep_prob=keep_prob, pre=pre_tockens, nxt=next_tockens, prefix=prefix,
                actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode)
    return _run(call, query, key, value, softmax_layout)


def npu_fusion_attention_v2(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                            input_layout: str, *, pse: torch.Tensor | None = None, padding_mask: Any = None,
                            atten_mask: torch.Tensor | None = None, query_rope: torch.Tensor | None = None,
                            key_rope: torch.Tensor | None = None, scale: float = 1.0, keep_prob: float = 1.0,
                            pre_tokens: int = MAX_TOKENS, next_tokens: int = MAX_TOKENS, inner_precise: int = 0,
                            prefix: Sequence[int] | None = None, actual_seq_qlen: Sequence[int] | None = None,
                            actual_seq_kvlen: Sequence[int] | None = None, sparse_mode: int = 0,
                            gen_mask_parallel: bool = True, sync: bool = False,
                            pse_type: int = 1,  # [V2] 属性 pse_type: 默认值为1
                            q_start_idx: Sequence[int] | None = None, kv_start_idx: Sequence[int] | None = None,
                            **other: Any) -> tuple[Any, ...]:
    """npu_fusion_attention with pse_type ([V2]): 0 = scale*(QK^T) + pse, 1 = scale*(QK^T + pse)."""
    extra = [name for name, value_ in (("query_rope", query_rope), ("key_rope", key_rope), *other.items())
             if value_ is not None]
    if extra:
        raise BenchUnsupported(f"npu_fusion_attention_v2 with {', '.join(extra)}: semantics not documented")
    call = Call(query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
                scale=scale, keep_prob=keep_prob, pre=pre_tokens, nxt=next_tokens, prefix=prefix,
                actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode,
                pse_type=pse_type)
    return _run(call, query, key, value)


def npu_fusion_attention_grad(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dy: torch.Tensor,
                              head_num: int, input_layout: str, *, pse: torch.Tensor | None = None,
                              padding_mask: Any = None, atten_mask: torch.Tensor | None = None,
                              softmax_max: torch.Tensor | None = None, softmax_sum: torch.Tensor | None = None,
                              softmax_in: torch.Tensor | None = None, attention_in: torch.Tensor | None = None,
                              scale_value: float = 1.0,  # [FAG] scale_value=1.
                              keep_prob: float = 1.0, pre_tockens: int = MAX_TOKENS, next_tockens: int = MAX_TOKENS,
                              inner_precise: int = 0, seed: int = 0, offset: int = 0, numels: int = 0,
                              prefix: Sequence[int] | None = None, actual_seq_qlen: Sequence[int] | None = None,
                              actual_seq_kvlen: Sequence[int] | None = None, sparse_mode: int = 0,
                              gen_mask_parallel: bool = True, sync: bool = False) -> tuple[Any, ...]:
    """-> (dq, dk, dv, dpse); the probabilities are recomputed from Q and K (softmax_* inputs are not needed)."""
    call = Call(query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
                scale=scale_value, keep_prob=keep_prob, pre=pre_tockens, nxt=next_tockens, prefix=prefix,
                actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode)
    with torch.no_grad():
        q, k, v = call.heads(query, call.n1), call.heads(key, call.n2), call.heads(value, call.n2)
        pse_w = None if pse is None else pse.to(call.work)
        out, row_max, row_sum = attend(q, k, v, pse_w, call.plan)
        dq, dk, dv, dpse = attend_backward(q, k, v, pse_w, out, row_max + torch.log(row_sum),
                                           call.heads(dy, call.n1), call.plan, pse is not None)
    return (call.unheads(dq, query.dtype), call.unheads(dk, key.dtype), call.unheads(dv, value.dtype),
            None if dpse is None or pse is None else dpse.to(pse.dtype))
