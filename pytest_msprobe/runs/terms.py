"""The terms run: the size of the terms a vendor's composite function may lose its error against.

CUDA computes gelu as x/2 * (1 + erff(x/sqrt 2)) and silu's gradient as g * s * (1 + x * (1 - s)): below
x = -1 the sum 1 + erff(...) cancels, and near silu's minimum (x = -1.278) so does 1 + x * (1 - s). erff's
2-ULP error is an error of about 2 ULPs of 1, so the result may be hundreds of its own ULPs off and the kernel
is still correct by its vendor's documentation. A gradient computed from the kernel's own output is alike:
erfinv's, sqrt(pi)/2 * exp(y^2) * g, turns y's error into 2 y^2 times as much.

Under a contract that lists such a function (api_specs/contracts.yaml `terms`), this run gives per element the
size of those terms, times the contract's ULP bound: the strict checks then allow that many units of fp32's
roundoff of it (thresholds.yaml `contract_terms`), as they allow a sum's order relative to its terms. Where
nothing cancels the terms are the result's own size, so the allowance adds nothing there.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .execution import Target, make_side
from .third_run import ReferenceRun, RunInputs, Summed, device_named

_SQRT_HALF = math.sqrt(0.5)
_TANH_K = math.sqrt(2.0 / math.pi)


def _gelu_step(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """The function gelu adds to 1: erf(x / sqrt 2), or tanh(k (x + 0.044715 x^3)) in the tanh form."""
    if approximate == "tanh":
        return torch.tanh(_TANH_K * (x + 0.044715 * x ** 3))
    return torch.erf(x * _SQRT_HALF)


class _Terms(torch.autograd.Function):
    """Forward: the terms of the function's last sum (scaled); backward: those of its gradient's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, form: str, scale: float, approximate: str) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.form, ctx.scale, ctx.approximate = form, scale, approximate
        if form == "gelu":
            return scale * 0.5 * x.abs() * (1 + _gelu_step(x, approximate).abs())
        return scale * x.abs()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        if ctx.form == "gelu":
            # g * (cdf + x * pdf): the cdf's 1 + step cancels as the forward's does
            pdf = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
            grad = g.abs() * (0.5 * (1 + _gelu_step(x, ctx.approximate).abs()) + x.abs() * pdf)
        elif ctx.form == "erfinv":
            # sqrt(pi)/2 * exp(y^2) * g from the kernel's own y = erfinv(x): y's relative error grows by 2 y^2
            y = torch.erfinv(x)
            grad = g.abs() * (0.5 * math.sqrt(math.pi)) * torch.exp(y * y) * (1 + 2 * y * y)
        else:
            # silu: g * s * (1 + x * (1 - s)); s's error moves both terms of the inner sum
            grad = g.abs() * torch.sigmoid(x) * (1 + x.abs())
        return ctx.scale * grad, None, None, None


FORMS = ("erfinv", "gelu", "silu")


def terms_fn(form: str, scale: float, approximate: str = "none") -> Any:
    """The terms function of `form` (erfinv, gelu, silu), called as the API is: its first argument is x."""
    def fn(x: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
        return _Terms.apply(x, form, scale, approximate)  # type: ignore[no-untyped-call,no-any-return]
    return fn


def terms_run(form: str, scale: float, inputs: RunInputs) -> Summed:
    """The terms run of a call to erfinv, gelu or silu (`form`) in fp32 (fp64 for fp64), scaled by the contract's
    bound, on the bench's device `on`; the gradient belongs to the first tensor argument."""
    args, kwargs, requires_grad, want_grad, shared, on = inputs
    side = make_side(list(args[:1]), {}, target=Target(on, lambda t: torch.float64 if t.dtype == torch.float64
                                                       else torch.float32, on == "cpu",
                                                       shared=shared if on == "cpu" else None),
                     requires_grad=requires_grad, want_grad=want_grad)
    where = "" if on == "cpu" else f" on {on}"
    run = ReferenceRun(side, terms_fn(form, scale, str(kwargs.get("approximate", "none"))), None, device_named(on),
                       f"terms of {form}'s cancelling sum{where}", "magnitude")
    return Summed(run, "contract_terms", frozenset({0}) if want_grad else frozenset())
