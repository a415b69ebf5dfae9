"""Solves and factorisations judged by their backward error, as LAPACK's own tests judge them.

An ill-conditioned matrix makes a correct solver's result differ from the bench's by its condition number times a
roundoff: a GPU's LU or QR, blocked and pivoted its own way, fails every elementwise bound while being the exact
answer for a matrix one roundoff away. What every backward-stable solver satisfies is a small residual, relative
to the sizes of its terms (LAPACK TESTING/LIN: dget03 for the inverse, dget04/dgtt02 for a solve, dpot01 for
Cholesky, dqrt17 for least squares). Where such an output fails its usual check under `strict`, it is judged by
that residual, within `backward_error.allowance` × √n × the device dtype's unit roundoff (api_specs/
error_model.yaml; a blocked solver's rounding errors add up as a random walk), while a wrong result (a bug, a step
in bf16, which leaves 2^-9 of the input's size) leaves a residual far above it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..records.record import Record
from ..runs.execution import UNIT_ROUNDOFF
from ..specs.loader import in_list

BACKWARD_ERROR = "judged by backward error: the residual is within a backward-stable solver's (the result is not unique " \
                 "to within the condition number)"
Residual = Callable[[list[torch.Tensor], dict[str, Any], torch.Tensor], "torch.Tensor | None"]


def _norm(t: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each matrix of a batch."""
    norm: torch.Tensor = t.flatten(-2).norm(dim=-1)
    return norm


def _tiny(t: torch.Tensor) -> torch.Tensor:
    return t.clamp_min(torch.finfo(torch.float64).tiny)


def _columns(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A right-hand side as a matrix: a vector (one dimension fewer than A) becomes one column."""
    return b.unsqueeze(-1) if b.dim() == a.dim() - 1 else b


def _inverse(args: list[torch.Tensor], kwargs: dict[str, Any], x: torch.Tensor) -> torch.Tensor | None:
    """||A X - I|| / (||A|| ||X||)."""
    a = args[0]
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    return _norm(a @ x - eye) / _tiny(_norm(a) * _norm(x))


def _solve(args: list[torch.Tensor], kwargs: dict[str, Any], x: torch.Tensor) -> torch.Tensor | None:
    """||A X - B|| / (||A|| ||X|| + ||B||); None for a solve from the right (left=False)."""
    if len(args) < 2 or not kwargs.get("left", True):
        return None
    a, b = args[0], _columns(args[1], args[0])
    x = _columns(x, args[0])
    return _norm(a @ x - b) / _tiny(_norm(a) * _norm(x) + _norm(b))


def _cholesky(args: list[torch.Tensor], kwargs: dict[str, Any], l_: torch.Tensor) -> torch.Tensor | None:
    """||L L^H - A|| / ||A|| of the triangle the call reads; None where the factor is not triangular."""
    a, upper = args[0], bool(kwargs.get("upper", False))
    if bool(((l_.tril(-1) if upper else l_.triu(1)) != 0).any()):
        return None
    a = a.triu() + a.triu(1).mH if upper else a.tril() + a.tril(-1).mH
    made = l_.mH @ l_ if upper else l_ @ l_.mH
    return _norm(made - a) / _tiny(_norm(a))


def _least_squares(args: list[torch.Tensor], kwargs: dict[str, Any], x: torch.Tensor) -> torch.Tensor | None:
    """The normal equations' residual ||A^H (A X - B)|| / (||A|| (||A|| ||X|| + ||B||)), for a tall or square A
    (LAPACK dqrt17); None for a wide one (its solution is the minimum-norm one, another test)."""
    if len(args) < 2 or args[0].shape[-2] < args[0].shape[-1]:
        return None
    a, b = args[0], _columns(args[1], args[0])
    x = _columns(x, args[0])
    return _norm(a.mH @ (a @ x - b)) / _tiny(_norm(a) * (_norm(a) * _norm(x) + _norm(b)))


# the residual of each API, of its output 0 (the other outputs of cholesky_ex and lstsq are compared as usual)
RESIDUALS: dict[str, Residual] = {"inv": _inverse, "inverse": _inverse, "solve": _solve, "cholesky": _cholesky,
                                  "cholesky_ex": _cholesky, "lstsq": _least_squares}


def judge_by_backward_error(record: Record, call: tuple[str, list[Any], dict[str, Any]], specs: Mapping[str, Any],
                            standard: str, device: list[Any]) -> None:
    """Judge again, by its backward error, output 0 of a solve or factorisation that failed its usual check.
    `call`: the API and the device side's arguments."""
    api, args, kwargs = call
    rows = record.outputs
    if standard != "strict" or not rows or rows[0].verdict != "error" or not device:
        return
    residual, a = RESIDUALS.get(api), args[0] if args else None
    if residual is None or not isinstance(a, torch.Tensor) or a.dtype not in UNIT_ROUNDOFF or a.dim() < 2 or \
            not a.numel() or not isinstance(device[0], torch.Tensor):
        return
    tensors = [t.detach().cpu().double() if isinstance(t, torch.Tensor) else t for t in args]
    options = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    try:
        found = residual(tensors, options, device[0].detach().cpu().double())
    except (RuntimeError, IndexError, ValueError):
        return
    if found is None:
        return
    worst = float(found.max()) if found.numel() else 0.0
    allowance = float(specs["error_model"]["backward_error"].get("allowance", 16))
    limit = allowance * math.sqrt(max(a.shape[-2:])) * UNIT_ROUNDOFF[a.dtype]
    valid = worst <= limit  # NaN fails
    rows[0].verdict, rows[0].check = ("pass" if valid else "error"), "backward_error"
    rows[0].verdict_message = BACKWARD_ERROR if valid else (
        f"judged by backward error: the residual is {worst:.3g} of its terms' size; limit {limit:.3g} "
        f"({allowance:g} × √n × unit roundoff)")


def applies(api: str, specs: Mapping[str, Any]) -> bool:
    """Whether error_model.yaml judges this API's failed output by its backward error."""
    return in_list(specs, api, "error_model", "backward_error") and api in RESIDUALS
