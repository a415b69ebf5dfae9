"""Ill-conditioned elementwise functions judged by their mixed forward-backward error, as their own tests judge them.

Near a zero of lgamma (x = 1, 2, -2.457...) or of digamma (x = 1.4616...), a change of one ULP in the argument
moves the result by many ULPs of the result: a correct kernel that reads its argument exactly but rounds one step
of its formula (CUDA's lgammaf: "larger inside (-10.001, -2.264)") is far from the bench
in the result's ULPs, and as close as the argument's own rounding allows. CPython's tests give lgamma an absolute
tolerance for that reason. What a correct kernel satisfies there is ŷ = f(x + Δx) + Δy with Δx within a ULP of
the argument in the dtype it computes in (fp32 for fp16 and bf16) and Δy within its forward bound.

Where such an output fails its usual check under `strict`, it is judged again in two parts: its ill-conditioned
elements (those where `argument_ulps` of the argument move f by more than that forward bound) by that mixed
error, within the contract's ULP bound (at least `forward_ulps`) plus the output's own rounding; every other
element by the usual check, on them alone, so that a bias or a gross error where the function is
well-conditioned still fails.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..records.record import Record
from ..runs import capture
from ..specs.loader import in_list
from ..verdict import contracts, grid
from .compare import compare_floats

CHECK = "argument_backward_error"
FUNCTIONS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "lgamma": lambda x, n: torch.lgamma(x),
    "digamma": lambda x, n: torch.digamma(x),
    "polygamma": lambda x, n: torch.polygamma(n, x),
}


def applies(api: str, specs: Mapping[str, Any]) -> bool:
    """Whether error_model.yaml judges this API's failed output by its mixed forward-backward error."""
    return in_list(specs, api, "error_model", CHECK) and api in FUNCTIONS


def spacing(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One ULP of `dtype` at each value of `v`, in float64: the strict checks' own unit (verdict/grid.ulp;
    subnormals' spacing below the smallest normal, zero included; infinite at inf and NaN)."""
    return torch.from_numpy(grid.ulp(v.detach().cpu().double().contiguous().numpy(), str(dtype)))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel of a `dtype` output computes in: fp32 for the 16-bit ones."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclasses.dataclass
class Conditioned:
    """Per element: the interval f takes within `argument_ulps` of the argument, and how far from f at the argument
    it reaches (NaN near a pole)."""

    lo: torch.Tensor
    hi: torch.Tensor
    middle: torch.Tensor
    moved: torch.Tensor


def interval(api: str, x: torch.Tensor, n: int, argument_ulps: float) -> Conditioned:
    """f over [x - k ULPs, x + k ULPs] of the compute dtype, in fp64 (three points: f is monotone on so short an
    interval away from its extrema, and its extremum value is the middle one's there)."""
    f, x64 = FUNCTIONS[api], x.detach().cpu().double()
    step = argument_ulps * spacing(x64, compute_dtype(x.dtype))
    values = torch.stack([f(x64 - step, n), f(x64, n), f(x64 + step, n)])
    lo, hi, middle = values.amin(0), values.amax(0), values[1]
    return Conditioned(lo, hi, middle, torch.maximum(hi - middle, middle - lo))


def argument(args: list[Any], device: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """The call's float tensor argument of the output's shape and its integer order (polygamma's n, else 0)."""
    xs = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point() and a.shape == device.shape]
    n = next((a for a in args if isinstance(a, int) and not isinstance(a, bool)), 0)
    if len(xs) != 1 or xs[0].data_ptr() == device.data_ptr():  # an in-place call's argument is its output now
        return None
    return xs[0], n


def judge(job: Any) -> None:
    """Judge again, by its mixed forward-backward error, output 0 of an ill-conditioned elementwise function that
    failed its usual check (`job`: its compare.Comparison)."""
    api, args, _ = job.validity
    rows, d = job.record.outputs, job.device[0] if job.device else None
    if job.options.standard != "strict" or not rows or rows[0].verdict != "error" or \
            not isinstance(d, torch.Tensor) or not grid.supported(str(d.dtype)) or not job.bench:
        return
    found = argument(args, d)
    if found is None:
        return
    rule = job.specs["error_model"][CHECK]
    k = float(rule.get("argument_ulps", 1))
    part = interval(api, found[0], found[1], k)
    bound = contracts.bound(job.specs, job.contract, api, str(d.dtype), False)
    ulps = max(float(rule.get("forward_ulps", 2)), bound[0] if bound is not None else 0.0)
    # ill-conditioned: k ULPs of the argument move f by more than the forward bound (NaN, near a pole, counts)
    ill_mask = ~(part.moved <= ulps * spacing(part.middle, d.dtype))
    v = d.detach().cpu().double()
    slack = ulps * spacing(v, compute_dtype(d.dtype)) + spacing(v, d.dtype)  # the kernel's bound, then its rounding
    outside = int((ill_mask & ~((v >= part.lo - slack) & (v <= part.hi + slack))).sum())
    ill = int(ill_mask.sum())
    rest = usual_verdict(job, ~ill_mask)
    rows[0].verdict, rows[0].check = ("pass" if outside == 0 and rest[0] == "pass" else "error"), CHECK
    mixed = f"{ill - outside} of {ill} element(s) where {k:g} ULP of the argument moves {api} by more than {ulps:g} " \
            f"ULPs are {api} of an argument within it, to {ulps:g} ULPs"
    rows[0].verdict_message = f"judged by mixed forward-backward error: {mixed}; the other {v.numel() - ill} " + (
        "pass the usual check" if rest[0] == "pass" else f"fail the usual check: {rest[1]}")


def usual_verdict(job: Any, keep: torch.Tensor) -> tuple[str, str]:
    """The usual check's verdict and message on the elements `keep` alone (a pass where there are none): a
    comparison of those elements, into a record of its own, with its own capture."""
    if not bool(keep.any()):
        return "pass", ""
    bench, device = job.bench[0], job.device[0]

    def picked(t: Any) -> Any:
        return t.detach()[keep.to(t.device)] if isinstance(t, torch.Tensor) and t.shape == device.shape else None

    third = None if job.third is None or picked(job.third[0]) is None else [picked(job.third[0])]
    scratch = Record(job.record.api, job.record.direction, job.record.seed)
    with capture.capturing():
        compare_floats(dataclasses.replace(
            job, record=scratch, bench=[picked(bench)], device=[picked(device)], third=third, positions=None,
            product=None, estimated=None, early=None, summed=None, validity=None))
    row = scratch.outputs[0]
    return row.verdict or row.status, row.verdict_message or row.message
