"""Fused NPU op kernels, sound and buggy, for `--msprobe-kernels` (the fused-op planted-bug suite).

Each arm is a mapping {"NPU.<op>": kernel} with torch_npu's signature, reachable as
`evals.planted.fused:TABLES.<arm>` (e.g. `--msprobe-kernels evals.planted.fused:TABLES.flash_p16`).
Sound variants are what correct kernels do differently from the fp32-once reference (flash attention's
probabilities in the input dtype, Hugging Face's RMSNorm rounding the normalised value, eager-mode rotary,
SwiGLU and group norm + silu, fp64 maths); bugs are what real fused kernels get wrong. Every kernel is differentiable,
so the backward items see it too; bugs planted in a backward say so in their name.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F

import bench_functions
from evals.planted.fused_attention import Flavour, grad_kernel, kernel

Fn = Callable[..., Any]


def _r(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).float()


def truncate(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded toward zero to dtype (the bug of a conversion that drops bits)."""
    t = x.to(dtype)
    away = t.to(x.dtype).abs() > x.abs()
    return torch.where(away, torch.nextafter(t, torch.zeros_like(t)), t)


class _WidenTruncating(torch.autograd.Function):
    """x widened to fp32; its gradient, computed in fp32, comes back truncated to x's dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.dtype = x.dtype
        return x.float()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return truncate(g.float(), ctx.dtype)


def _floats(fn: Fn, x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_floats(fn, v) for v in x)
    return x


def _outputs(fn: Fn, out: Any) -> Any:
    return _floats(fn, out)


# ---------------------------------------------------------------------------------------- generic arms
def _wide(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[Any], bool]:
    """(the outputs computed in fp64, those of the plain call, whether the op returns a sequence)."""
    ref = bench_functions.get(name)
    assert ref is not None
    with torch.no_grad():  # on copies: some ops write their results into `out`
        plain = ref(*_floats(torch.clone, list(args)), **{k: _floats(torch.clone, v) for k, v in kwargs.items()})
    wide = ref(*_floats(lambda t: t.double(), list(args)), **{k: _floats(lambda t: t.double(), v)
                                                               for k, v in kwargs.items()})
    seq = isinstance(plain, (tuple, list))
    return (list(wide) if seq else [wide]), (list(plain) if seq else [plain]), seq


def _like(out: list[Any], plain: list[Any], seq: bool, cast: Callable[[torch.Tensor, torch.dtype], Any]) -> Any:
    got = [cast(g, p.dtype) if isinstance(g, torch.Tensor) and isinstance(p, torch.Tensor) and g.is_floating_point()
           else p for g, p in zip(out, plain)]
    return tuple(got) if seq else got[0]


def fp64(name: str) -> Fn:
    """Sound: the reference computed in fp64, each float output rounded once to the dtype it has."""
    def run(*args: Any, **kwargs: Any) -> Any:
        return _like(*_wide(name, args, kwargs), lambda g, dt: g.to(dt))

    return run


def fp32(name: str) -> Fn:
    """Sound: the reference on 16-bit inputs widened to fp32, each float output rounded once (a fused
    kernel computing in fp32); the twin the hand-written bugs below differ from."""
    def run(*args: Any, **kwargs: Any) -> Any:
        ref = bench_functions.get(name)
        assert ref is not None
        with torch.no_grad():
            plain = ref(*_floats(torch.clone, list(args)), **{k: _floats(torch.clone, v) for k, v in kwargs.items()})
        wide = ref(*_floats(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, list(args)),
                   **kwargs)
        seq = isinstance(plain, (tuple, list))
        return _like(list(wide) if seq else [wide], list(plain) if seq else [plain], seq, lambda g, dt: g.to(dt))

    return run


def truncating(name: str) -> Fn:
    """Bug: every float output truncated (toward zero) instead of rounded; gradients pass unchanged."""
    def run(*args: Any, **kwargs: Any) -> Any:
        return _like(*_wide(name, args, kwargs),
                     lambda g, dt: g.to(dt) + (truncate(g.detach(), dt) - g.detach().to(dt)))

    return run


def gross(name: str) -> Fn:
    """Bug: one element in 10^4 of every float output off by 4.6 % (a race, a stale tile)."""
    ref = bench_functions.get(name)
    assert ref is not None

    def run(*args: Any, **kwargs: Any) -> Any:
        def hit(t: torch.Tensor) -> torch.Tensor:
            if t.numel() == 0:
                return t
            flat = torch.zeros(t.numel(), dtype=t.dtype)
            flat[:: 10007] = 1
            return t * (1 + 0.046 * flat.view(t.shape))

        return _outputs(hit, ref(*args, **kwargs))

    return run


def grad_truncating(name: str) -> Fn:
    """Bug in the backward: the op in fp32 (as the `fp32` arm), its input gradients truncated to the
    inputs' dtype instead of rounded."""
    ref = bench_functions.get(name)
    assert ref is not None
    low = (torch.float16, torch.bfloat16)

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            plain = ref(*args, **kwargs)
        wide = ref(*[_WidenTruncating.apply(a) if isinstance(a, torch.Tensor) and a.dtype in low  # type: ignore[no-untyped-call]
                     else a for a in args], **kwargs)
        seq = isinstance(plain, (tuple, list))
        return _like(list(wide) if seq else [wide], list(plain) if seq else [plain], seq, lambda g, dt: g.to(dt))

    return run


# ---------------------------------------------------------------------------------------- RMSNorm
def rms_hf(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Sound: Hugging Face's LlamaRMSNorm: fp32 statistics, the normalised value rounded to the input
    dtype, then gamma times it in the input dtype."""
    x = self.float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)
    return gamma * (x * rstd).to(self.dtype), rstd


def rms_msq16(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Bug: the mean of squares accumulated in the input dtype (16 squares at a time)."""
    x = self.float()
    total = torch.zeros(x.shape[:-1], dtype=torch.float32)
    for c in range(0, x.shape[-1], 16):
        total = _r(total + x[..., c:c + 16].pow(2).sum(-1), self.dtype)
    rstd = torch.rsqrt(total / x.shape[-1] + epsilon).unsqueeze(-1)
    return (x * rstd * gamma.float()).to(self.dtype), rstd


def rms_eps_outside(self: torch.Tensor, gamma: torch.Tensor,
                    epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Bug: epsilon added outside the square root."""
    x = self.float()
    rstd = 1.0 / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + epsilon)
    return (x * rstd * gamma.float()).to(self.dtype), rstd


class _RmsDgamma16(torch.autograd.Function):
    """fp32 forward; a backward whose dgamma sums the rows in the input dtype (16 rows at a time)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, gamma, rstd)
        return (xf * rstd * gamma.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        x, gamma, rstd = ctx.saved_tensors
        xhat, gf = x.float() * rstd, g.float()
        gg = gf * gamma.float()
        dx = rstd * (gg - xhat * (gg * xhat).mean(-1, keepdim=True))
        rows = (gf * xhat).reshape(-1, x.shape[-1])
        dgamma = torch.zeros(x.shape[-1])
        for c in range(0, rows.shape[0], 16):
            dgamma = _r(dgamma + rows[c:c + 16].sum(0), x.dtype)
        return dx.to(x.dtype), dgamma.to(gamma.dtype), None


def rms_dgamma16(self: torch.Tensor, gamma: torch.Tensor,
                 epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    y = _RmsDgamma16.apply(self, gamma, epsilon)  # type: ignore[no-untyped-call]
    return y, torch.rsqrt(self.float().pow(2).mean(-1, keepdim=True) + epsilon)


# ---------------------------------------------------------------------------------------- group norm + silu
def _gns_stats(input: torch.Tensor, group: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = input.float().reshape(input.shape[0], group, -1)
    return x.mean(-1), torch.rsqrt(x.var(-1, unbiased=False) + eps)


def gns_eager(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, group: int,
              eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sound: a model's eager `F.silu(F.group_norm(x))` in the input dtype (torch's group norm keeps its
    statistics in fp32 and rounds its output; silu rounds again)."""
    mean, rstd = _gns_stats(input, group, eps)
    y = F.group_norm(input, group, weight, bias, eps)
    return F.silu(y), mean.to(input.dtype), rstd.to(input.dtype)


def gns_silu32(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, group: int,
               eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sound: the group norm in fp32, its output stored in the input dtype, then silu in fp32, rounded once
    (two kernels, the first's output in the model's dtype)."""
    mean, rstd = _gns_stats(input, group, eps)
    shape = (1, input.shape[1]) + (1,) * (input.dim() - 2)
    y = (input.float().reshape(*mean.shape, -1) - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    y = y.reshape(input.shape)
    if weight is not None:
        y = y * weight.float().view(shape)
    if bias is not None:
        y = y + bias.float().view(shape)
    return F.silu(_r(y, input.dtype)).to(input.dtype), mean.to(input.dtype), rstd.to(input.dtype)


# ---------------------------------------------------------------------------------------- rotary
def _half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_eager(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half") -> torch.Tensor:
    """Sound: Hugging Face's eager `q * cos + rotate_half(q) * sin`, every op in the input dtype."""
    if rotary_mode != "half":
        return cast(torch.Tensor, bench_functions.rotary.npu_rotary_mul(  # type: ignore[attr-defined]
            input, r1, r2, rotary_mode))
    return input * r1 + _half(input) * r2


def rotary_sign(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half") -> torch.Tensor:
    """Bug: rotate_half with the sign on the wrong half (cat(x2, -x1))."""
    x1, x2 = torch.chunk(input.float(), 2, dim=-1)
    return (r1.float() * input.float() + r2.float() * torch.cat((x2, -x1), -1)).to(input.dtype)


class _RotaryBackT(torch.autograd.Function):
    """fp32 forward; a backward that rotates r2 * g forward instead of by the transpose."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(r1, r2)
        return (r1.float() * x.float() + r2.float() * _half(x.float())).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        r1, r2 = ctx.saved_tensors
        gf = g.float()
        dx = r1.float() * gf + _half(r2.float() * gf)  # the bug: rotate, not its transpose (-rotate)
        return dx.to(g.dtype), None, None


def rotary_back_sign(input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor,
                     rotary_mode: str = "half") -> torch.Tensor:
    return cast(torch.Tensor, _RotaryBackT.apply(input, r1, r2))  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------------------------------- SwiGLU
def swiglu_eager(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sound: eager `F.silu(a) * b` in the input dtype (silu's result rounded, then the product)."""
    a, b = torch.chunk(input, 2, dim=dim)
    return F.silu(a) * b


def swiglu_swapped(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Bug: the halves swapped (silu(b) * a)."""
    a, b = torch.chunk(input.float(), 2, dim=dim)
    return (F.silu(b) * a).to(input.dtype)


class _SwigluDs(torch.autograd.Function):
    """fp32 forward; a backward taking silu'(a) as sigmoid(a) (the product rule's second term dropped)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.dim = dim
        a, b = torch.chunk(x.float(), 2, dim=dim)
        return (F.silu(a) * b).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        a, b = torch.chunk(x.float(), 2, dim=ctx.dim)
        s, gf = torch.sigmoid(a), g.float()
        return torch.cat((gf * b * s, gf * a * s), dim=ctx.dim).to(x.dtype), None


def swiglu_dsilu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return cast(torch.Tensor, _SwigluDs.apply(input, dim))  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------------------------------- the arms
@dataclass
class FusedArm:
    name: str
    kind: str  # "bug" | "variant"
    what: str
    table: dict[str, Any]
    base: str = ""  # a bug's sound twin (an arm's name; "" the clean run): an item counts when the bug changed it


GENERIC_OPS = ("npu_fusion_attention_v2", "npu_add_rms_norm", "npu_layer_norm_eval", "npu_group_norm_silu",
               "npu_fast_gelu", "npu_fast_gelu_backward", "npu_mish", "npu_scaled_masked_softmax",
               "npu_scaled_masked_softmax_backward", "npu_linear", "npu_linear_backward", "matmul_backward",
               "npu_grouped_matmul", "npu_confusion_transpose", "npu_confusion_transpose_backward", "npu_sort_v2",
               "npu_apply_adam", "npu_apply_adam_w", "npu_moe_gating_top_k_softmax", "npu_dynamic_quant",
               "npu_rms_norm_backward", "npu_rotary_mul_backward", "npu_swiglu_backward")
MAIN = ("npu_rms_norm", "npu_rotary_mul", "npu_swiglu")
GRAD_OPS = ("npu_group_norm_silu", "npu_fast_gelu", "npu_mish", "npu_scaled_masked_softmax", "npu_linear")
FLASH = Flavour(p_dtype=True)


def _attn(fl: Flavour) -> dict[str, Any]:
    return {"NPU.npu_fusion_attention": kernel(fl), "NPU.npu_fusion_attention_grad": grad_kernel(fl)}


def _generic(make: Callable[[str], Fn], ops: tuple[str, ...]) -> dict[str, Any]:
    return {f"NPU.{op}": make(op) for op in ops}


ARMS = [
    # sound variants
    FusedArm("flash_p16", "variant", "flash attention, P in the input dtype, dS fp32", _attn(FLASH)),
    FusedArm("flash_p16_ds16", "variant", "flash attention, P and dS in the input dtype (FA2)",
             _attn(Flavour(p_dtype=True, ds_round=True))),
    FusedArm("flash_fp32", "variant", "flash attention, P kept in fp32, 128-key tiles", _attn(Flavour(p_dtype=False))),
    FusedArm("rms_hf", "variant", "RMSNorm rounding the normalised value (Hugging Face)",
             {"NPU.npu_rms_norm": rms_hf}),
    FusedArm("rotary_eager", "variant", "rotary in eager ops of the input dtype", {"NPU.npu_rotary_mul": rotary_eager}),
    FusedArm("swiglu_eager", "variant", "swiglu as eager silu(a) * b", {"NPU.npu_swiglu": swiglu_eager}),
    FusedArm("gns_eager", "variant", "group_norm_silu as eager silu(group_norm(x))",
             {"NPU.npu_group_norm_silu": gns_eager}),
    FusedArm("gns_silu32", "variant", "group_norm_silu: the norm's output stored, silu in fp32",
             {"NPU.npu_group_norm_silu": gns_silu32}),
    FusedArm("fp64", "variant", "fp64 maths, rounded once",
             _generic(fp64, GENERIC_OPS + MAIN + ("npu_fusion_attention",))),
    FusedArm("fp32", "variant", "fp32 maths, rounded once", _generic(fp32, MAIN + GRAD_OPS)),
    # bugs in the forward
    FusedArm("flash_rowsum16", "bug", "attention row sum accumulated in the input dtype",
             _attn(Flavour(bug="rowsum16")), base="flash_p16"),
    FusedArm("flash_scale", "bug", "attention scale 1/sqrt(hidden) for the given one",
             _attn(Flavour(bug="scale_hidden")), base="flash_p16"),
    FusedArm("flash_causal_leak", "bug", "causal mask keeping one future key", _attn(Flavour(bug="causal_leak")),
             base="flash_p16"),
    FusedArm("flash_gqa", "bug", "GQA: query head h reads kv head h % Nkv", _attn(Flavour(bug="gqa_modulo")),
             base="flash_p16"),
    FusedArm("rms_msq16", "bug", "RMSNorm mean of squares accumulated in the input dtype",
             {"NPU.npu_rms_norm": rms_msq16}, base="fp32"),
    FusedArm("rms_eps", "bug", "RMSNorm epsilon outside the square root", {"NPU.npu_rms_norm": rms_eps_outside},
             base="fp32"),
    FusedArm("rotary_sign", "bug", "rotate_half with the sign on the wrong half", {"NPU.npu_rotary_mul": rotary_sign},
             base="fp32"),
    FusedArm("swiglu_swap", "bug", "swiglu halves swapped", {"NPU.npu_swiglu": swiglu_swapped}, base="fp32"),
    FusedArm("truncate", "bug", "outputs truncated instead of rounded",
             _generic(truncating, GENERIC_OPS + MAIN + ("npu_fusion_attention",)), base="fp64"),
    FusedArm("gross", "bug", "one element in 10^4 off by 4.6 %", _generic(gross, GENERIC_OPS + MAIN)),
    # bugs in the backward
    FusedArm("flash_dq16", "bug", "flash backward: dQ accumulated in the input dtype",
             _attn(Flavour(bug="dq_acc16")), base="flash_p16"),
    FusedArm("flash_dk_scale", "bug", "flash backward: dK without the scale", _attn(Flavour(bug="dk_noscale")),
             base="flash_p16"),
    FusedArm("rms_dgamma16", "bug", "RMSNorm backward: dgamma summed in the input dtype",
             {"NPU.npu_rms_norm": rms_dgamma16}, base="fp32"),
    FusedArm("rotary_back", "bug", "rotary backward: rotate instead of its transpose",
             {"NPU.npu_rotary_mul": rotary_back_sign}, base="fp32"),
    FusedArm("swiglu_dsilu", "bug", "swiglu backward: silu'(a) taken as sigmoid(a)", {"NPU.npu_swiglu": swiglu_dsilu},
             base="fp32"),
    FusedArm("grad_truncate", "bug", "input gradients truncated instead of rounded",
             _generic(grad_truncating, MAIN + GRAD_OPS), base="fp32"),
]
BY_NAME = {a.name: a for a in ARMS}
TABLES = types.SimpleNamespace(**{a.name: a.table for a in ARMS})
