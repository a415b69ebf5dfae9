"""Outputs that are not unique: judged by what every correct result satisfies, not by the bench's own choice.

`not_unique` in api_specs/error_model.yaml lists the APIs. Where values tie, a correct kernel may return the
indices of any of them (sort, argsort, topk, kthvalue, mode, median: `ties`); where indices repeat, it may keep
any one of the values written to an element (scatter, index_copy, index_put without a reduction:
`duplicate_writers`); a decomposition's factors may differ in signs and bases (qr, geqrf, svd, eigh:
`decompositions`). Only an output row that failed its usual check is judged again, so a device that returns
what the bench returned keeps its record as it was; a row judged here says so in its message and in `check`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ..records.record import Record
from ..runs.execution import UNIT_ROUNDOFF
from ..specs.loader import in_list

TIES = "judged by validity: indices point at equal values (ties may break either way)"
DECOMPOSITION = ("judged by validity: the factors reconstruct the input and are orthonormal (signs and bases are "
                 "not unique)")
WRITERS = "judged by validity: each element holds the value of one of its writers (duplicate indices may keep any)"

# the dimension argument of each API with ties: (position, default); None: no indices without it (median(x))
_DIM: dict[str, tuple[int, int | None]] = {"sort": (1, -1), "argsort": (1, -1), "topk": (2, -1),
                                          "kthvalue": (2, -1), "mode": (1, -1), "median": (1, None),
                                          "nanmedian": (1, None)}
Verdict = tuple[bool, str]  # valid, and the reason
# the outputs of a decomposition whose signs or bases are not unique (its values, S and L, are)
_FACTORS: dict[str, tuple[int, ...]] = {"qr": (0, 1), "geqrf": (0, 1), "svd": (0, 2), "eigh": (1,)}


def judge_by_validity(record: Record, call: tuple[str, list[Any], dict[str, Any]], specs: Mapping[str, Any],
                      standard: str, bench: list[Any], device: list[Any]) -> None:
    """Judge again, by validity, the failed rows of a forward item's outputs whose values are not unique.
    `call`: the API and the device side's arguments."""
    api, args, kwargs = call
    rows = record.outputs
    if standard != "strict" or len(rows) != len(device) or len(bench) != len(device) or \
            not any(row.verdict == "error" for row in rows):
        return
    base = api.removesuffix("_") if api.endswith("_") and not api.endswith("__") else api
    if in_list(specs, api, "error_model", "not_unique", "ties"):
        check = "ties"
        i = 0 if base == "argsort" else 1  # the indices output
        outcome = {i: _ties(base, args, kwargs, bench, device, i)} \
            if i < len(rows) and rows[i].verdict == "error" and is_indices(device[i]) else {}
    elif in_list(specs, api, "error_model", "not_unique", "duplicate_writers") and rows[0].verdict == "error":
        check = "duplicate_writers"
        outcome = {0: _writers(base, args, kwargs, bench[0], device[0])}
    elif in_list(specs, api, "error_model", "not_unique", "decompositions") and base in _FACTORS:
        check = "decomposition"
        failed = [i for i in _FACTORS[base] if i < len(rows) and rows[i].verdict == "error"]
        allowance = float(specs["error_model"]["not_unique"].get("decomposition_allowance", 16))
        verdict = _decomposition(base, args, kwargs, bench, device, allowance) if failed else None
        outcome = {i: verdict for i in failed}
    else:
        return
    for i, verdict in outcome.items():
        if verdict is not None:
            valid, message = verdict
            rows[i].verdict, rows[i].verdict_message, rows[i].check = "pass" if valid else "error", message, check


def _arg(args: list[Any], kwargs: dict[str, Any], position: int, name: str, default: Any = None) -> Any:
    return args[position] if position < len(args) else kwargs.get(name, default)


def is_indices(x: Any) -> bool:
    """An integer tensor, as sort-like APIs return their indices."""
    return isinstance(x, torch.Tensor) and x.dtype in (torch.int64, torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise equality where NaN equals NaN."""
    equal = a == b
    return equal | (a.isnan() & b.isnan()) if a.is_floating_point() or a.is_complex() else equal


def _input_and_dim(api: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A sort-like call's input and the dimension it sorts along, as it was called."""
    position, default = _DIM.get(api, (1, -1))
    return _arg(args, kwargs, 0, "input", kwargs.get("self")), _arg(args, kwargs, position, "dim", default)


def _ties(api: str, args: list[Any], kwargs: dict[str, Any], bench: list[Any], device: list[Any],
          i: int) -> Verdict | None:
    """Indices output `i` of a sort-like API: in range, pointing at the values the bench's indices point at (and
    at the device's own values output), a permutation (sort, argsort) or distinct (topk) along the dimension.
    None where it cannot be told (no input tensor, a stable sort, whose indices are unique)."""
    x, dim = _input_and_dim(api, args, kwargs)
    if not isinstance(x, torch.Tensor) or not isinstance(dim, int) or isinstance(dim, bool) or \
            (api in ("sort", "argsort") and _arg(args, kwargs, 3 if api == "argsort" else 99, "stable")):
        return None
    got, want = device[i], bench[i]
    if not isinstance(want, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        return False, "judged by validity: indices of another dtype or shape than the bench's"
    x, got, want = (t.detach().cpu() for t in (x, got, want))
    if x.dim() == 0:
        x, got, want = x.reshape(1), got.reshape(1), want.reshape(1)
    dim %= x.dim()
    n = x.shape[dim]
    outside = int(((got < 0) | (got >= n)).sum())
    if outside:
        return False, f"judged by validity: {outside} of {got.numel()} indices outside [0, {n})"
    if got.dim() < x.dim():  # keepdim=False
        got, want = got.unsqueeze(dim), want.unsqueeze(dim)
    pointed = x.gather(dim, got)
    wrong = ~_same(pointed, x.gather(dim, want))
    values = device[0] if i > 0 and isinstance(device[0], torch.Tensor) else None
    if values is not None and values.dtype == x.dtype:
        wrong |= ~_same(pointed, values.detach().cpu().reshape(pointed.shape))
    if int(wrong.sum()):
        return False, (f"judged by validity: {int(wrong.sum())} of {got.numel()} indices point at other values "
                       "than the bench's (or the device's values output)")
    if api in ("sort", "argsort", "topk") and got.numel():
        ordered = got.sort(dim).values
        if api == "topk" and bool((ordered.diff(dim=dim) == 0).any()):
            return False, "judged by validity: an index repeats along the dimension (topk's are distinct)"
        if api != "topk" and not bool((ordered == torch.arange(n).reshape([-1] + [1] * (x.dim() - dim - 1))).all()):
            return False, "judged by validity: the indices are not a permutation along the dimension"
    return True, TIES


def following(api: str, fn: Any, recorded: torch.Tensor) -> Any:
    """The bench of a sort-like API's backward item, routing the gradient through the indices its forward recorded
    where they are another valid choice among tied values (as `_ties` judges the forward): the device's gradient
    went where its indices point, and the bench's own choice would send it elsewhere. Where they are not valid,
    the bench keeps its own indices."""
    def bench(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if not isinstance(out, tuple) or len(out) < 2 or \
                _ties(api, list(args), kwargs, list(out), [out[0], recorded], 1) != (True, TIES):
            return out
        x, dim = _input_and_dim(api, list(args), kwargs)
        dim %= max(1, x.dim())
        index = recorded.to(x.device)
        kept = index.dim() == x.dim()
        values = x.gather(dim, index if kept else index.unsqueeze(dim))
        return type(out)((values if kept else values.squeeze(dim), index))

    return bench


def _writers(api: str, args: list[Any], kwargs: dict[str, Any], bench: Any, device: Any) -> Verdict | None:
    """An output written through indices: each element that an index writes holds one of the values written to
    it, each other one the bench's value (the input's). None where it cannot be told, or with a reduction (sums
    of every writer, which the usual checks judge)."""
    x = _arg(args, kwargs, 0, "input", kwargs.get("self"))
    if not all(isinstance(t, torch.Tensor) for t in (x, bench, device)) or bench.shape != device.shape:
        return None
    try:
        if api.startswith("max_unpool"):
            written = _unpooled(int(api[-2]), x, _arg(args, kwargs, 1, "indices"), device.shape)
        elif device.shape == x.shape:
            written = _written(api, args, kwargs, torch.arange(x.numel()).reshape(x.shape), device.dtype)
        else:
            return None
    except (RuntimeError, IndexError, TypeError, ValueError):
        return None
    if written is None:
        return None
    where, values = written
    out = device.detach().cpu().reshape(-1)
    where, values = where.reshape(-1), values.detach().cpu().reshape(-1)
    hit = torch.zeros(out.numel(), dtype=torch.int64).index_add_(0, where, _same(out[where], values).long()) > 0
    target = torch.zeros(out.numel(), dtype=torch.bool).index_fill_(0, where, True)
    kept = _same(out, bench.detach().cpu().reshape(-1).to(out.dtype))
    stray, changed = int((target & ~hit).sum()), int((~target & ~kept).sum())
    if stray or changed:
        return False, (f"judged by validity: {stray} of {int(target.sum())} written elements hold a value none of "
                       f"their writers has; {changed} elements no index writes differ from the bench's")
    return True, WRITERS


def _unpooled(k: int, x: torch.Tensor, indices: Any, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor] | None:
    """max_unpool{k}d: each input value goes to its index within its (batch, channel) plane of the output; the
    rest of the output is zero (the bench's). None where the shapes do not say so."""
    if not isinstance(indices, torch.Tensor) or indices.shape != x.shape or tuple(shape[:-k]) != tuple(x.shape[:-k]):
        return None
    lead = tuple(x.shape[:-k])
    planes = torch.arange(math.prod(lead)).reshape(lead + (1,) * k) * math.prod(shape[-k:])
    return (planes + indices.detach().cpu()).reshape(-1), x.detach().cpu().reshape(-1)


def _written(api: str, args: list[Any], kwargs: dict[str, Any], ids: torch.Tensor,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the flat element each written value goes to, the values), both of the same shape; None: a reduction."""
    if api == "scatter":
        dim, index = _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index")
        src = _arg(args, kwargs, 3, "src", kwargs.get("value"))
        if kwargs.get("reduce") is not None or len(args) > 4 or not isinstance(index, torch.Tensor):
            return None
        index = index.detach().cpu()
        if isinstance(src, torch.Tensor) and src.dim() == index.dim():
            values = src[tuple(slice(0, k) for k in index.shape)]
        else:
            values = torch.full(index.shape, src.item() if isinstance(src, torch.Tensor) else src, dtype=dtype)
        return ids.gather(dim, index), values
    if api == "index_copy":
        dim, index, source = (_arg(args, kwargs, p, k) for p, k in ((1, "dim"), (2, "index"), (3, "source")))
        if not isinstance(source, torch.Tensor):
            return None
        where = ids.index_select(dim, index.detach().cpu().reshape(-1))
        return where, source.reshape(where.shape)
    if api == "index_put":
        indices, values = _arg(args, kwargs, 1, "indices"), _arg(args, kwargs, 2, "values")
        if _arg(args, kwargs, 3, "accumulate", False) or not isinstance(indices, (list, tuple)):
            return None
        where = ids[tuple(slice(None) if t is None else t.detach().cpu() for t in indices)]
        values = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
        return where, values.detach().cpu().to(dtype).expand_as(where)
    return None


def _decomposition(api: str, args: list[Any], kwargs: dict[str, Any], bench: list[Any], device: list[Any],
                   allowance: float) -> Verdict | None:
    """The factors of a decomposition (qr, geqrf, svd, eigh): they reconstruct the input, and their bases are
    orthonormal, each within `allowance` × n × the device dtype's unit roundoff (the reconstruction's relative
    to the input's Frobenius norm, per matrix). None where it cannot be told."""
    a = _arg(args, kwargs, 0, "A", kwargs.get("input"))
    if not isinstance(a, torch.Tensor) or a.dtype not in UNIT_ROUNDOFF or a.dim() < 2 or not a.numel() or \
            not all(isinstance(t, torch.Tensor) for t in (*bench, *device)):
        return None
    A = a.detach().cpu().double()
    outs = [t.detach().cpu().double() for t in device]
    m, n = A.shape[-2:]
    try:
        if api == "qr" or api == "geqrf":
            if api == "qr":
                Q, R = outs[:2]
            else:
                k = min(m, n)
                Q, R = torch.linalg.householder_product(outs[0][..., :k], outs[1]), outs[0][..., :k, :].triu()
            if not Q.numel() or bool((R.tril(-1) != 0).any()):
                return None if not Q.numel() else (False, "judged by validity: R is not upper triangular")
            made, bases = Q @ R, [Q]
        elif api == "svd":
            U, S, X = outs[:3]
            k = S.shape[-1]

            def product(u: torch.Tensor, s: torch.Tensor, x: torch.Tensor, v: bool) -> torch.Tensor:
                return (u[..., :k] * s.unsqueeze(-2)) @ (x[..., :k].mH if v else x[..., :k, :])

            # torch.svd returns V, torch.linalg.svd Vh: whichever reconstructs the input from the bench's outputs
            b = [t.detach().cpu().double() for t in bench[:3]]
            v = bool((product(b[0], b[1], b[2], True) - A).abs().max() <
                     (product(b[0], b[1], b[2], False) - A).abs().max()) \
                if X.shape[-1] == X.shape[-2] else X.shape[-1] == k
            made, bases = product(U, S, X, v), [U, X if v else X.mH]
        else:  # eigh, of the triangle it reads
            L, Q = outs[:2]
            lower = str(_arg(args, kwargs, 1, "UPLO", "L")).upper() == "L"
            A = A.tril() + A.tril(-1).mH if lower else A.triu() + A.triu(1).mH
            made, bases = (Q * L.unsqueeze(-2)) @ Q.mH, [Q]
        norm = A.flatten(-2).norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
        residual = float(((made - A).abs().flatten(-2).amax(-1) / norm).max())
        orthogonal = max(float((B.mH @ B - torch.eye(B.shape[-1], dtype=B.dtype)).abs().max()) for B in bases)
    except (RuntimeError, IndexError, ValueError):
        return None
    limit = allowance * max(m, n) * UNIT_ROUNDOFF[a.dtype]
    if not (residual <= limit and orthogonal <= limit):  # NaN fails
        return False, (f"judged by validity: the factors reconstruct the input to {residual:.3g} of its norm and "
                       f"are orthonormal to {orthogonal:.3g}; limit {limit:.3g} ({allowance:g} × n × unit roundoff)")
    return True, DECOMPOSITION
