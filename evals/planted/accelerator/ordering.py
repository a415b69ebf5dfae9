"""ties-and-duplicates: what the contract leaves undefined (ties of sort and topk, duplicate writers of
scatter and index_put, the signs of QR and SVD), resolved otherwise than torch's CPU kernels.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from evals.planted.accelerator.numerics import (
    named_args,
    plain_float,
)
from evals.planted.arm import Arm, Impl, torch_forms


def _flipped_select(x: torch.Tensor, dim: int, call: Callable[[torch.Tensor], Any]) -> Any:
    """An index-returning op run on x reversed along dim: equal keys resolve to the other end."""
    values, indices = call(x.flip(dim))
    return values, x.shape[dim] - 1 - indices


def _sort(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    """sort(stable=False): the order of equal keys is undefined; here the last comes first."""
    p = named_args(a, kw, ("dim", "descending", "stable"))
    if p is None or p.get("stable") or not plain_float(x) or x.dim() == 0:
        return orig(x, *a, **kw)
    dim, desc = p.get("dim", -1), bool(p.get("descending", False))
    v, i = _flipped_select(x, dim, lambda y: orig(y, dim=dim, descending=desc, stable=True))
    return torch.return_types.sort((v, i))


def _argsort(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    p = named_args(a, kw, ("dim", "descending", "stable"))
    if p is None or p.get("stable") or not plain_float(x) or x.dim() == 0:
        return orig(x, *a, **kw)
    dim, desc = p.get("dim", -1), bool(p.get("descending", False))
    return x.shape[dim] - 1 - orig(x.flip(dim), dim=dim, descending=desc, stable=True)


def _topk(orig: Impl, x: Any, k: Any, *a: Any, **kw: Any) -> Any:
    """topk whose equal keys resolve to the other end; the values are read from x at those indices, so the
    gradient flows from the call's own input, as a kernel's does (not through a reversed copy of it)."""
    p = named_args(a, kw, ("dim", "largest", "sorted"))
    if p is None or not plain_float(x) or x.dim() == 0:
        return orig(x, k, *a, **kw)
    dim = p.get("dim", -1)
    with torch.no_grad():
        _, i = _flipped_select(x.detach(), dim,
                               lambda y: orig(y, k, dim, p.get("largest", True), p.get("sorted", True)))
    return torch.return_types.topk((x.gather(dim, i), i))


def _by_dim(kind: str, first: tuple[str, ...]) -> Impl:
    """kthvalue / median / mode along a dim: which of equal values' indices is returned is undefined."""
    def impl(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
        p = named_args(a, kw, first + ("dim", "keepdim"))
        if p is None or not plain_float(x) or x.dim() == 0 or (kind == "median" and "dim" not in p):
            return orig(x, *a, **kw)
        dim = p.get("dim", -1)
        lead = [p[n] for n in first]
        v, i = _flipped_select(x, dim, lambda y: orig(y, *lead, dim, bool(p.get("keepdim", False))))
        return getattr(torch.return_types, kind)((v, i))
    return impl


def _scatter(orig: Impl, x: Any, dim: Any, index: Any, *a: Any, **kw: Any) -> Any:
    """scatter with duplicate indices: the writer that wins is undefined; here the first, not the last."""
    p = named_args(a, kw, ("src",))
    src = p.get("src") if p is not None else None
    if not isinstance(src, torch.Tensor) or not isinstance(index, torch.Tensor) or not isinstance(dim, int) or \
            not plain_float(x) or index.dim() == 0 or index.numel() == 0:
        return orig(x, dim, index, *a, **kw)
    used = src[tuple(slice(0, s) for s in index.shape)]
    return orig(x, dim, index.flip(dim), used.flip(dim))


def _index_copy(orig: Impl, x: Any, dim: Any, index: Any, source: Any, *a: Any, **kw: Any) -> Any:
    if a or kw or not plain_float(x) or not isinstance(index, torch.Tensor) or index.dim() != 1 or \
            not isinstance(source, torch.Tensor) or source.dim() == 0 or not isinstance(dim, int):
        return orig(x, dim, index, source, *a, **kw)
    return orig(x, dim, index.flip(0), source.flip(dim))


def _index_put(orig: Impl, x: Any, indices: Any, values: Any, *a: Any, **kw: Any) -> Any:
    p = named_args(a, kw, ("accumulate",))
    if p is None or p.get("accumulate") or not plain_float(x) or not isinstance(values, torch.Tensor) or \
            not indices or not all(isinstance(i, torch.Tensor) and i.dtype == torch.long for i in indices):
        return orig(x, indices, values, *a, **kw)
    try:
        idx = torch.broadcast_tensors(*indices)  # type: ignore[no-untyped-call]  # unannotated in torch
        rest = x.shape[len(indices):]
        vals = values.expand(idx[0].shape + rest)
    except RuntimeError:
        return orig(x, indices, values, *a, **kw)
    flat = tuple(i.reshape(-1).flip(0) for i in idx)
    return orig(x, flat, vals.reshape((-1,) + tuple(rest)).flip(0), *a, **kw)


def _signs(k: int, dtype: torch.dtype) -> torch.Tensor:
    """+1, -1, +1, ...: the columns whose sign flips."""
    return (1 - 2 * (torch.arange(k) % 2)).to(dtype)


def _qr(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    """QR: Q * diag(s), diag(s) * R for signs s = +-1 is as exact a decomposition (LAPACK does not fix them)."""
    if not plain_float(x) or x.dim() < 2:
        return orig(x, *a, **kw)
    q, r = orig(x, *a, **kw)
    k = min(x.shape[-2], x.shape[-1])
    s = _signs(k, r.dtype)
    r = torch.cat([r[..., :k, :] * s[:, None], r[..., k:, :]], -2)
    if q.numel():
        q = torch.cat([q[..., :, :k] * s, q[..., :, k:]], -1)
    return (torch.return_types.linalg_qr if getattr(orig, "__name__", "") == "linalg_qr" else torch.return_types.qr)((q, r))  # type: ignore[attr-defined]  # in torch.return_types at runtime, not in its stubs


def _svd(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
    """SVD: U * diag(s), diag(s) * V^H for signs s = +-1 (singular vectors are unique up to sign)."""
    name = getattr(orig, "__name__", "")
    if not plain_float(x) or x.dim() < 2 or kw.get("compute_uv") is False or (name == "svd" and len(a) > 1):
        return orig(x, *a, **kw)
    u, sv, v = orig(x, *a, **kw)
    k = sv.shape[-1]
    s = _signs(k, u.dtype)
    u = torch.cat([u[..., :, :k] * s, u[..., :, k:]], -1)
    if name == "linalg_svd":  # V^H: rows
        v = torch.cat([v[..., :k, :] * s[:, None], v[..., k:, :]], -2)
    else:  # torch.svd's V: columns
        v = torch.cat([v[..., :, :k] * s, v[..., :, k:]], -1)
    return (torch.return_types.linalg_svd if name == "linalg_svd" else torch.return_types.svd)((u, sv, v))  # type: ignore[attr-defined]  # in torch.return_types at runtime, not in its stubs


TIES_AND_DUPLICATES = Arm("ties-and-duplicates", "variant", "undefined ties, duplicate writers and decomposition signs, resolved otherwise",
        {**torch_forms(_sort, ("sort",)), **torch_forms(_argsort, ("argsort",)), **torch_forms(_topk, ("topk",)),
         **torch_forms(_by_dim("kthvalue", ("k",)), ("kthvalue",)), **torch_forms(_by_dim("median", ()), ("median",)),
         **torch_forms(_by_dim("mode", ()), ("mode",)), **torch_forms(_scatter, ("scatter", "scatter_")),
         **torch_forms(_index_copy, ("index_copy", "index_copy_")), **torch_forms(_index_put, ("index_put", "index_put_")),
         torch.linalg.qr: _qr, **torch_forms(_qr, ("qr",)), torch.linalg.svd: _svd, **torch_forms(_svd, ("svd",))})
