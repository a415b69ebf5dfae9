"""The third run of an item: what a correct kernel may lose, learnt beside the bench.

With --msprobe-reference it is that device's run in the recorded dtype (msprobe's GPU leg). Under the
`strict` standard it is torch's own kernel on CPU in the recorded dtype, or, for contractions, the
magnitude run (the API on the absolute values of its inputs). Also the bench-side helpers the error
model needs: a contraction's product before its bias, and inputs rounded as an autocast kernel saw them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list
from .backends import select as select_device
from .execution import Device, Side, make_side, map_structure, resolve


@dataclass
class ReferenceRun:
    """The third run: a reference device's or torch's own kernel in the device dtype (`role` "torch"),
    or, for contractions under `strict`, the API on the absolute values of its inputs ("magnitude").

    `side` is None where the bench already computed exactly this run.
    """

    side: Side | None
    fn: Any
    autocast: torch.dtype | None
    device: Device
    label: str
    role: str = "torch"

    def cotangent(self, value: Any) -> Any:
        """The recorded gradient as this run backpropagates it (its absolute value for the magnitude run)."""
        return value.abs() if self.role == "magnitude" and isinstance(value, torch.Tensor) else value


def third_run(options: CheckOptions, resolved: Any, name: Any, specs: dict[str, Any], plan: Any,
                    args: list[Any], kwargs: dict[str, Any], requires_grad: set[int],
                    want_grad: bool) -> ReferenceRun | None:
    """The third run the chosen standard compares against, or None.

    With --msprobe-reference the API runs on that device in the recorded dtype (three-way check).
    Otherwise `strict` learns what a correct kernel may lose: from torch's own kernel on CPU in the
    recorded dtype, or, for contractions (whose 16-bit CPU kernels are too slow to run), from the
    size of their terms: the API on CPU on the absolute values of its inputs, in fp32 (fp64 for fp64).
    """
    if options.reference_device:
        ref_device = select_device(options.reference_device)
        ref = resolve(name.api_type, name.api_name, ref_device, specs, getattr(resolved, "call", None))
        side = make_side(args, kwargs, device=ref_device.name, dtype_for=lambda t: t.dtype,
                         requires_grad=requires_grad, want_grad=want_grad, bench=False)
        return ReferenceRun(side, ref.device_fn, plan.autocast, ref_device, f"{ref.label} on {ref_device.name}")
    if options.standard != "strict":
        return None
    low = (torch.float16, torch.bfloat16)
    if want_grad and in_list(specs, name.api_name, "error_model", "torch_backward") and (plan.autocast in low or all(
            t.dtype in low for t in args[:2] if isinstance(t, torch.Tensor))):
        side = make_side(args, kwargs, device="cpu", requires_grad=requires_grad, want_grad=want_grad, bench=True,
                         dtype_for=lambda t: plan.autocast if plan.autocast in low and t.is_floating_point()
                         else t.dtype)
        return ReferenceRun(side, _conv_torch_backward, None, Device("cpu"),
                            "torch's conv backward kernel on cpu, device dtype (forward in fp32)")
    if error_kind(name.api_name, specs) != "contraction":
        side = make_side(args, kwargs, device="cpu", dtype_for=lambda t: t.dtype, requires_grad=requires_grad,
                         want_grad=want_grad, bench=True)
        return ReferenceRun(side, resolved.bench_fn, plan.autocast, Device("cpu"), "torch's kernel on cpu, device dtype")
    scalars = set(specs["error_model"].get("contraction_scalars", ()))

    def absolute(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            moved = v.abs()
            if id(v) in requires_grad:
                requires_grad.add(id(moved))
            return moved
        return v

    abs_args = [map_structure(absolute, a) for a in args]
    abs_kwargs = {k: (abs(v) if k in scalars and isinstance(v, (int, float)) else map_structure(absolute, v))
                  for k, v in kwargs.items()}
    side = make_side(abs_args, abs_kwargs, device="cpu", requires_grad=requires_grad, want_grad=want_grad, bench=True,
                     dtype_for=lambda t: t.dtype if t.dtype == torch.float64 or not t.is_floating_point()
                     else torch.float32)
    return ReferenceRun(side, resolved.bench_fn, None, Device("cpu"), "magnitude: the API on |inputs| in fp32",
                        "magnitude")


def bench_product(api: str, side: Side, leaves: list[Any], specs: dict[str, Any]) -> Any:
    """A contraction's bench result without its additive argument (api_specs error_model.contraction_bias),
    or None: the product a sound kernel may round before adding the bias."""
    rule = specs["error_model"].get("contraction_bias", {}).get(api)
    if not rule or not leaves or not isinstance(leaves[0], torch.Tensor):
        return None
    position = rule["position"]
    bias = side.kwargs.get(rule["name"], side.args[position] if len(side.args) > position else None)
    if not isinstance(bias, torch.Tensor):
        return None
    out = leaves[0].detach()
    bias = bias.detach().to(out.dtype) * side.kwargs.get(rule.get("scale", ""), 1)
    if rule["broadcast"] == "channel" and len(side.args) > 1 and isinstance(side.args[1], torch.Tensor):
        bias = bias.reshape(-1, *[1] * (side.args[1].dim() - 2))  # the weight's spatial dimensions
    try:
        return out - bias
    except RuntimeError:  # shapes that do not broadcast: no allowance
        return None


def autocast_round(v: Any, dtype: torch.dtype, requires_grad: set[int]) -> Any:
    """A float tensor wider than the autocast dtype, rounded to it (kept in its own dtype)."""
    if not isinstance(v, torch.Tensor) or v.dtype not in (torch.float32, torch.float64):
        return v
    rounded = v.detach().to(dtype).to(v.dtype)
    if id(v) in requires_grad:
        requires_grad.add(id(rounded))
    return rounded


_CONV_PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class _ConvTorchBackward(torch.autograd.Function):
    """A 16-bit convolution whose forward is computed in fp32 (torch's 16-bit CPU forward is tens of
    times slower) and whose backward is torch's own 16-bit kernel, which rounds its partial sums."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: list[int],
                padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.params = (b is not None, stride, padding, dilation, groups)
        conv = torch.ops.aten.convolution
        out: torch.Tensor = conv(x.float(), w.float(), None if b is None else b.float(), stride, padding, dilation,
                                 False, [0] * len(stride), groups)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        has_bias, stride, padding, dilation, groups = ctx.params
        gx, gw, gb = torch.ops.aten.convolution_backward(
            grad.to(x.dtype), x, w, [w.shape[0]] if has_bias else None, stride, padding, dilation, False,
            [0] * len(stride), groups, [True, True, has_bias])
        return gx, gw, gb, None, None, None, None


def _conv_torch_backward(*args: Any, **kwargs: Any) -> torch.Tensor:
    """F.conv{1,2,3}d's signature over _ConvTorchBackward (a string padding falls back to plain conv)."""
    bound = dict(zip(_CONV_PARAMS, args), **kwargs)
    x, w = bound["input"], bound["weight"]
    spatial = w.dim() - 2

    def expand(value: Any, default: int) -> list[int]:
        value = default if value is None else value
        return [int(value)] * spatial if isinstance(value, int) else [int(v) for v in value]

    if isinstance(bound.get("padding"), str) or x.dim() != w.dim():  # unbatched or "same": torch's own
        return cast(torch.Tensor, getattr(torch.nn.functional, f"conv{spatial}d")(*args, **kwargs))
    out: torch.Tensor = _ConvTorchBackward.apply(  # type: ignore[no-untyped-call]  # Function.apply: unannotated
        x, w, bound.get("bias"), expand(bound.get("stride"), 1), expand(bound.get("padding"), 0),
        expand(bound.get("dilation"), 1), int(bound.get("groups") or 1))
    return out
