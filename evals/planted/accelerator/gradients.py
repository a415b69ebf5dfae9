"""cuda-broadcast-grad, cuda-embedding-backward: gradients that CUDA sums in another order (a broadcast
operand's, an embedding's over sorted ids), with fp32 accumulators.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from evals.planted.accelerator.numerics import (
    F32,
    named_args,
    plain_float,
)
from evals.planted.accelerator.sums import sum_to
from evals.planted.arm import Arm, Impl, torch_forms

_OPS: dict[str, Callable[..., torch.Tensor]] = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


class _Broadcast(torch.autograd.Function):
    """add/sub/mul/div: forward torch's own (IEEE-exact); a broadcast operand's gradient summed over the broadcast
    dimensions with an fp32 accumulator in CUDA's reduce order (torch's formulas otherwise)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, op: str, alpha: Any) -> torch.Tensor:
        ctx.op, ctx.alpha = op, alpha
        ctx.save_for_backward(a, b)
        return _OPS[op](a, b, **({"alpha": alpha} if alpha is not None else {}))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        a, b = ctx.saved_tensors
        alpha = 1 if ctx.alpha is None else ctx.alpha
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga_by: dict[str, Callable[[], torch.Tensor]] = {"add": lambda: g, "sub": lambda: g, "mul": lambda: g * b,
                                                            "div": lambda: g / b}
            ga = ga_by[ctx.op]()
        if ctx.needs_input_grad[1]:
            gb_by: dict[str, Callable[[], torch.Tensor]] = {"add": lambda: g * alpha if alpha != 1 else g,
                                                            "sub": lambda: -g * alpha, "mul": lambda: g * a,
                                                            "div": lambda: -g * ((a / b) / b)}
            gb = gb_by[ctx.op]()
        out: list[torch.Tensor | None] = []
        for grad, x in ((ga, a), (gb, b)):
            if grad is None:
                out.append(None)
            elif grad.shape != x.shape:
                out.append(sum_to(grad.to(x.dtype), x.shape, x.dtype))
            else:
                out.append(grad.to(x.dtype))
        return out[0], out[1], None, None


def _broadcast_grad(op: str) -> Impl:
    def impl(orig: Impl, a: Any, b: Any, *rest: Any, **kw: Any) -> Any:
        name = getattr(orig, "__name__", "")
        inplace = name.endswith("_") and not name.startswith("__") or name.startswith("__i")
        if name.startswith("__r"):
            a, b = b, a
        plain: Callable[[], Any] = lambda: orig(*((b, a) if name.startswith("__r") else (a, b)), *rest, **kw)  # noqa: E731
        if rest or set(kw) - {"alpha"} or not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or \
                not torch.is_grad_enabled() or not (plain_float(a) or plain_float(b)):
            return plain()
        try:
            shape = torch.broadcast_shapes(a.shape, b.shape)  # type: ignore[no-untyped-call]  # unannotated in torch
        except RuntimeError:
            return plain()
        if not any(t.requires_grad and t.shape != shape for t in (a, b)):
            return plain()  # no broadcast gradient: the elementwise gradient is torch's
        alpha = kw.get("alpha")
        if inplace:  # into a copy of `a`, then back into `a` (autograd records the copy)
            return a.copy_(_Broadcast.apply(a.clone(), b, op, alpha))  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
        return _Broadcast.apply(a, b, op, alpha)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated
    return impl


def _forms(op: str, inplace: tuple[str, ...]) -> dict[Any, Impl]:
    names = {"add": ("add", "__add__", "__radd__"), "sub": ("sub", "subtract", "__sub__", "__rsub__"),
             "mul": ("mul", "multiply", "__mul__", "__rmul__"), "div": ("div", "divide", "__truediv__",
                                                                         "__rtruediv__", "__div__", "__rdiv__")}[op]
    return torch_forms(_broadcast_grad(op), names + inplace)


ROWS_PER_CHUNK = 10  # CUDA's NROWS_PER_THREAD: a segment's rows are added in chunks of 10, then the chunks


def embedding_grad(indices: torch.Tensor, grad: torch.Tensor, num: int, padding_idx: int | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """CUDA's embedding_dense_backward: the indices sorted, each id's rows summed in sorted order in fp32 (in
    chunks of ROWS_PER_CHUNK, then the chunks' partial sums in order), rounded once to `dtype`."""
    width = grad.shape[-1]
    idx, rows = indices.reshape(-1), grad.reshape(-1, width).float()
    if padding_idx is not None:
        keep = idx != padding_idx
        idx, rows = idx[keep], rows[keep]
    out = torch.zeros(num, width, dtype=F32)
    if idx.numel() == 0:
        return out.to(dtype)
    ids, order = torch.sort(idx, stable=True)
    rows = rows[order]
    n = ids.numel()
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = ids[1:] != ids[:-1]
    segment = torch.cumsum(starts.long(), 0) - 1
    first = torch.nonzero(starts).reshape(-1)
    pos = torch.arange(n) - first[segment]
    chunk_start = starts | (pos % ROWS_PER_CHUNK == 0)
    chunk = torch.cumsum(chunk_start.long(), 0) - 1
    partial = torch.zeros(int(chunk[-1]) + 1, width, dtype=F32)
    within = pos % ROWS_PER_CHUNK
    for k in range(ROWS_PER_CHUNK):  # one row per chunk and step: fp32 adds in sorted order
        m = within == k
        partial.index_add_(0, chunk[m], rows[m])
    chunk_segment, chunk_rank = segment[chunk_start], pos[chunk_start] // ROWS_PER_CHUNK
    total = torch.zeros(len(first), width, dtype=F32)
    for r in range(int(chunk_rank.max()) + 1):
        m = chunk_rank == r
        total.index_add_(0, chunk_segment[m], partial[m])
    out[ids[first]] = total
    return out.to(dtype)


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, indices: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.num, ctx.padding_idx, ctx.dtype = weight.shape[0], padding_idx, weight.dtype
        return F.embedding(indices, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (indices,) = ctx.saved_tensors
        return embedding_grad(indices, g, ctx.num, ctx.padding_idx, ctx.dtype), None, None


def _embedding(orig: Impl, indices: Any, weight: Any, *a: Any, **kw: Any) -> Any:
    p = named_args(a, kw, ("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"))
    if p is None or p.get("max_norm") is not None or p.get("scale_grad_by_freq") or p.get("sparse") or \
            not plain_float(weight) or weight.dim() != 2 or not weight.requires_grad or not torch.is_grad_enabled():
        return orig(indices, weight, *a, **kw)
    pad = p.get("padding_idx")
    pad = pad + weight.shape[0] if pad is not None and pad < 0 else pad
    return _Embedding.apply(weight, indices, pad)  # type: ignore[no-untyped-call]  # torch's Function.apply is unannotated


CUDA_BROADCAST_GRAD = Arm("cuda-broadcast-grad", "variant", "CUDA: a broadcast operand's gradient summed in fp32 in another order",
        {**_forms("add", ("add_", "__iadd__")), **_forms("sub", ("sub_", "__isub__")),
         **_forms("mul", ("mul_", "__imul__")), **_forms("div", ("div_", "__itruediv__"))})


CUDA_EMBEDDING_BACKWARD = Arm("cuda-embedding-backward", "variant", "CUDA embedding_dense_backward: sorted ids, segments summed in fp32",
        {F.embedding: _embedding})
