"""npu_fusion_attention (+ _grad, _v2): tiled flash-attention reference.

It computes in its inputs' dtype, float32 at least: the check decides that dtype per output dtype
(api_specs/apis.yaml, precision.raise_map_by_api: float32 for bf16 outputs, float64 otherwise).

The score matrix is never materialised (attention_tiles.py): queries and keys are walked in blocks
of BLOCK_Q x BLOCK_K with an online softmax, and the backward is a custom autograd Function that recomputes each block
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

import contextvars
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import BenchUnsupported
from .attention_tiles import ALIBI_ROWS, Plan, Segment, Tiled, attend, attend_backward

MAX_TOKENS = 2147483647  # [FA] 参数说明: pre_tockens / next_tockens default
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")  # [FA] 参数说明 input_layout
LOW = (torch.float16, torch.bfloat16)
_ROUNDED: contextvars.ContextVar[bool] = contextvars.ContextVar("rounded", default=False)


# ----------------------------------------------------------------------------- layouts

def to_heads(x: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    """Any layout -> (N, rows, D), rows = B*S batch-major (or T for TND)."""
    if layout == "TND":
        return x.permute(1, 0, 2)
    if layout in ("BSH", "SBH"):
        x = x.unflatten(-1, (heads, x.shape[-1] // heads))  # type: ignore[no-untyped-call]  # unannotated in torch
    order = {"BSH": (2, 0, 1, 3), "SBH": (2, 1, 0, 3), "BSND": (2, 0, 1, 3), "BNSD": (1, 0, 2, 3)}[layout]
    return x.permute(order).flatten(1, 2)


def from_heads(x: torch.Tensor, layout: str, batch: int) -> torch.Tensor:
    """(N, rows, D) -> the layout; the inverse of to_heads."""
    if layout == "TND":
        return x.permute(1, 0, 2)
    x = x.unflatten(1, (batch, x.shape[1] // batch))  # type: ignore[no-untyped-call]  # untyped in torch; (N, B, S, D)
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
        if _ROUNDED.get() and query.dtype in LOW:
            self.plan.rounding = query.dtype
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
            x = x.unflatten(  # type: ignore[no-untyped-call]  # untyped in torch
                1, (self.batch, self.sq)).permute(1, 0, 2)  # (B, N1, Sq)
        return x.unsqueeze(-1).repeat(*([1] * x.dim()), 8).float()

    def numels(self) -> int:
        return self.n1 * sum(s.sq * s.sk for s in self.plan.segments)


# ----------------------------------------------------------------------------- tiled kernel

# ----------------------------------------------------------------------------- torch_npu entry points

# (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels) ([FA] 输出说明)
FusionOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]


def run_call(call: Call, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             softmax_layout: str = "") -> FusionOutputs:
    pse = None if call.pse is None else call.pse.to(call.work)
    out, row_max, row_sum = Tiled.apply(  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
        call.heads(query, call.n1), call.heads(key, call.n2), call.heads(value, call.n2), pse, call.plan)
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
                         softmax_layout: str = "") -> FusionOutputs:
    """-> (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels) ([FA] 输出说明)."""
    call = Call(query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
                scale=scale, keep_prob=keep_prob, pre=pre_tockens, nxt=next_tockens, prefix=prefix,
                actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode)
    return run_call(call, query, key, value, softmax_layout)


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
                            **other: Any) -> FusionOutputs:
    """npu_fusion_attention with pse_type ([V2]): 0 = scale*(QK^T) + pse, 1 = scale*(QK^T + pse)."""
    extra = [name for name, value_ in (("query_rope", query_rope), ("key_rope", key_rope), *other.items())
             if value_ is not None]
    if extra:
        raise BenchUnsupported(f"npu_fusion_attention_v2 with {', '.join(extra)}: semantics not documented")
    call = Call(query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
                scale=scale, keep_prob=keep_prob, pre=pre_tokens, nxt=next_tokens, prefix=prefix,
                actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode,
                pse_type=pse_type)
    return run_call(call, query, key, value)


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


def _rounded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as a sound flash kernel computes it in a 16-bit dtype: fp32 scores, row max and row sum,
    the probabilities rounded to the inputs' dtype before the product with V, and in the backward P
    recomputed in that dtype before dV and dS (dS in fp32), rowsum(dO * O) from the stored 16-bit O.
    The `strict` standard's third run of these ops (api_specs/bench_functions.yaml `rounded`)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        token = _ROUNDED.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _ROUNDED.reset(token)

    return run


npu_fusion_attention_rounded = _rounded(npu_fusion_attention)
npu_fusion_attention_v2_rounded = _rounded(npu_fusion_attention_v2)
npu_fusion_attention_grad_rounded = _rounded(npu_fusion_attention_grad)
