"""Kernel bugs and correct kernel variants, each a set of replacements for torch functions.

An arm replaces some torch functions while the device call runs (`plugin.py` arms it through a
TorchFunctionMode inside `pytest_msprobe_device_call`), only for calls whose first float tensor has
the dump's dtype. Bugs are what real accelerator kernels get wrong; variants are sound kernels that
differ from torch's own CPU kernels (another summation order, flash-style attention, more accurate
maths), which a checker must pass. Every replacement is differentiable, so backward items see it too.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from evals.planted.arm import Arm, Impl, torch_forms


def _acc(dtype: torch.dtype) -> torch.dtype:
    """A low-precision accumulator: the dtype itself for 16-bit, bf16 for fp32."""
    return torch.bfloat16 if dtype == torch.float32 else dtype


def _low_sum(x: torch.Tensor, dim: int, acc: torch.dtype, keepdim: bool = False) -> torch.Tensor:
    """Sum along dim, every partial sum rounded to `acc` (a kernel accumulating in low precision)."""
    moved = x.movedim(dim, -1)
    total = torch.zeros(moved.shape[:-1], dtype=torch.float32)
    for i in range(moved.shape[-1]):
        total = (total + moved[..., i].float()).to(acc).float()
    return total.unsqueeze(dim) if keepdim else total


# ------------------------------------------------------------------------------------------ contractions
def _matmul_chunks(a: torch.Tensor, b: torch.Tensor, combine: str, chunk: int = 16) -> torch.Tensor:
    """a @ b with K cut into chunks, each chunk's product exact-ish in fp32, combined by `combine`."""
    k = a.shape[-1]
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    if combine == "fp64":
        return (a.double() @ b.double()).to(out_dtype)
    if combine == "splitk":  # four fp32 partial products, summed last-first in fp32
        step = -(-k // 4)
        parts = [a[..., i:i + step].float() @ b[..., i:i + step, :].float() for i in range(0, k, step)]
        total = parts[-1]
        for p in reversed(parts[:-1]):
            total = total + p
        return total.to(out_dtype)
    acc = _acc(out_dtype)  # low-precision accumulation across chunks of 16
    running: torch.Tensor | None = None
    for i in range(0, k, chunk):
        part = a[..., i:i + chunk].float() @ b[..., i:i + chunk, :].float()
        running = part.to(acc).float() if running is None else (running + part).to(acc).float()
    assert running is not None
    return running.to(out_dtype)


def _linear(combine: str, unfused: bool = False) -> Impl:
    """F.linear with the bias added in the accumulator (fused epilogue), or, `unfused`, to the product
    already rounded to the output dtype (a matmul kernel followed by an add kernel)."""
    def linear(orig: Impl, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
        if bias is None:
            return _matmul_chunks(x, weight.transpose(-1, -2), combine)
        if unfused:
            return _matmul_chunks(x, weight.transpose(-1, -2), combine) + bias
        ones = torch.ones(*x.shape[:-1], 1, dtype=x.dtype)  # [x, 1] @ [W, b]^T: the bias joins the accumulation
        return _matmul_chunks(torch.cat([x, ones], -1), torch.cat([weight, bias[:, None]], -1).transpose(-1, -2),
                              combine)
    return linear


def _matmul(combine: str) -> Impl:
    def matmul(orig: Impl, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> Any:
        if a.dim() < 2 or b.dim() < 2 or kw:
            return orig(a, b, **kw)
        return _matmul_chunks(a, b, combine)
    return matmul


def _contractions(combine: str) -> dict[Any, Impl]:
    mm = _matmul(combine)
    return {F.linear: _linear(combine), torch.matmul: mm, torch.Tensor.__matmul__: mm, torch.Tensor.matmul: mm,
            torch.bmm: mm, torch.mm: mm, torch.Tensor.bmm: mm, torch.Tensor.mm: mm}


def _conv2d(combine: str) -> Impl:
    """conv2d as unfold + matmul (im2col), combined as `combine`; other arguments as torch."""
    def conv2d(orig: Impl, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
        if groups != 1 or isinstance(padding, str) or x.dim() != 4:
            return orig(x, weight, bias, stride, padding, dilation, groups)
        n, _, h, w = x.shape
        o, _, kh, kw = weight.shape
        def pair(v: Any) -> tuple[Any, ...]:
            return (v, v) if isinstance(v, int) else tuple(v)

        (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
        cols = F.unfold(x, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))  # exact: a copy
        flat = weight.reshape(o, -1)
        if bias is not None:  # the bias joins the accumulation as one more column
            flat = torch.cat([flat, bias[:, None]], -1)
            cols = torch.cat([cols, torch.ones(n, 1, cols.shape[-1], dtype=cols.dtype)], 1)
        out = _matmul_chunks(flat, cols, combine)
        oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return out.reshape(n, o, oh, ow)
    return conv2d


# ------------------------------------------------------------------------------------------ attention
def _sdpa(mode: str) -> Impl:
    def sdpa(orig: Impl, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, **kw: Any) -> Any:
        if mode == "gross":
            out = orig(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)
            factor = torch.ones(out.numel(), dtype=torch.float32)
            factor[:: 9973] = 1.046  # one element in 10^4 off by 4.6 %
            return (out.float() * factor.reshape(out.shape)).to(out.dtype)
        if dropout_p or kw or q.shape[-3] != k.shape[-3]:
            return orig(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)
        s = (q.float() @ k.float().transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        if is_causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1 + k.shape[-2] - q.shape[-2]),
                              float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.float()
        p = torch.exp(s - s.amax(-1, keepdim=True))
        if mode == "lownorm":  # the row sum accumulated in low precision
            return ((p @ v.float()) / _low_sum(p, -1, _acc(q.dtype), keepdim=True)).to(q.dtype)
        # flash-style: fp32 scores and sums, the probabilities rounded to the input dtype for P @ V
        return ((p.to(q.dtype).float() @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype)
    return sdpa


# ------------------------------------------------------------------------------------------ softmax, norms
def _softmax(mode: str) -> Impl:
    def softmax(orig: Impl, x: torch.Tensor, dim: int | None = None, *a: Any, **kw: Any) -> Any:
        dtype = kw.get("dtype") or x.dtype
        if dim is None or a:
            return orig(x, dim, *a, **kw)
        xf = x.float()
        if mode == "lse":
            return torch.exp(xf - torch.logsumexp(xf, dim, keepdim=True)).to(dtype)
        if mode == "fp64":
            return torch.softmax(x.double(), dim).to(dtype)
        e = torch.exp(xf - xf.amax(dim, keepdim=True))
        return (e / _low_sum(e, dim, _acc(x.dtype), keepdim=True)).to(dtype)
    return softmax


def _layer_norm(mode: str) -> Impl:
    def layer_norm(orig: Impl, x: torch.Tensor, shape: Any, weight: Any = None, bias: Any = None,
                   eps: float = 1e-5) -> Any:
        if mode == "eps":
            return orig(x, shape, weight, bias, eps * 100)
        dims = tuple(range(-len(shape), 0))
        work = torch.float64 if mode == "fp64" else torch.float32
        xf = x.to(work)
        mean = xf.mean(dims, keepdim=True)
        var = ((xf - mean) ** 2).mean(dims, keepdim=True)  # two-pass variance
        y = (xf - mean) * torch.rsqrt(var + eps)
        if mode == "rounded":  # normalised value rounded to the storage dtype, affine in the storage dtype
            y = y.to(x.dtype)
            y = y * weight if weight is not None else y
            return y + bias if bias is not None else y
        y = y * weight.to(work) if weight is not None else y
        y = y + bias.to(work) if bias is not None else y
        return y.to(x.dtype)
    return layer_norm


def _adaptive_avg_pool2d(orig: Impl, x: torch.Tensor, output_size: Any) -> Any:
    if output_size not in (1, (1, 1), [1, 1]):
        return orig(x, output_size)
    return (_low_sum(x.flatten(-2), -1, _acc(x.dtype)) / (x.shape[-1] * x.shape[-2])).to(x.dtype)[..., None, None]


def _mean_low(orig: Impl, x: torch.Tensor, dim: Any = None, keepdim: bool = False, **kw: Any) -> Any:
    if dim is None or kw or not isinstance(dim, (int, list, tuple)) or (not isinstance(dim, int) and len(dim) != 1):
        return orig(x, dim, keepdim, **kw) if dim is not None else orig(x, **kw)
    d = dim if isinstance(dim, int) else dim[0]
    return (_low_sum(x, d, _acc(x.dtype), keepdim) / x.shape[d]).to(x.dtype)


# ------------------------------------------------------------------------------------------ elementwise
def _in_dtype(fn: Callable[[torch.Tensor], torch.Tensor]) -> Impl:
    def impl(orig: Impl, x: torch.Tensor, *a: Any, **kw: Any) -> Any:
        return fn(x) if not a and not kw else orig(x, *a, **kw)
    return impl


def _sincos_naive(fn: Callable[[torch.Tensor], torch.Tensor]) -> Impl:
    """Range reduction with 2*pi rounded to the input dtype (no extended-precision constant)."""
    def impl(orig: Impl, x: torch.Tensor, *a: Any, **kw: Any) -> Any:
        two_pi = torch.tensor(2 * math.pi, dtype=x.dtype).float()
        xf = x.float()
        k = torch.round(xf / two_pi)
        return fn((xf - k * two_pi).double()).to(x.dtype)
    return impl


def _pow_explog(orig: Impl, x: Any, y: Any, *a: Any, **kw: Any) -> Any:
    """x ** y as exp(y * log|x|), every step in the input dtype."""
    if not isinstance(x, torch.Tensor) or a or kw:
        return orig(x, y, *a, **kw)
    dtype = x.dtype
    mag = torch.exp((y * torch.log(x.abs())).to(dtype))
    if isinstance(y, (int, float)) and float(y).is_integer() and int(y) % 2:
        mag = torch.where(x < 0, -mag, mag)
    return mag.to(dtype)


def _rpow_explog(orig: Impl, x: torch.Tensor, base: Any) -> Any:
    if not isinstance(base, (int, float)) or base <= 0:
        return orig(x, base)
    return torch.exp((x * math.log(base)).to(x.dtype)).to(x.dtype)


def _silu_fast(orig: Impl, x: torch.Tensor, inplace: bool = False) -> Any:
    """sigmoid in half precision (fp16 for fp32 inputs), the product rounded once more."""
    low = torch.float16 if x.dtype == torch.float32 else x.dtype
    return (x * torch.sigmoid(x.to(low)).to(x.dtype)).to(x.dtype)


def _truncate(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 values rounded toward zero to dtype."""
    if dtype == torch.bfloat16:
        return (values.float().view(torch.int32) & -65536).view(torch.float32).to(dtype)
    rounded = values.to(dtype)
    over = rounded.double().abs() > values.abs()
    toward = torch.nextafter(rounded, torch.zeros((), dtype=dtype))
    return torch.where(over, toward, rounded)


def _truncating(op: Callable[[torch.Tensor, Any], torch.Tensor], inplace: bool = False) -> Impl:
    def impl(orig: Impl, a: Any, b: Any, *rest: Any, **kw: Any) -> Any:
        if not isinstance(a, torch.Tensor) or rest or kw or not a.is_floating_point():
            return orig(a, b, *rest, **kw)
        plain = op(a, b)
        wide = op(a.detach().double(), b.detach().double() if isinstance(b, torch.Tensor) else b)
        out = plain + (_truncate(wide, a.dtype) - plain.detach())  # truncated values, torch's own gradient
        if inplace:
            with torch.no_grad():
                a.copy_(out.detach())
            return a
        return out
    return impl


def _fp64(op: Callable[..., torch.Tensor]) -> Impl:
    """The op computed in fp64 and rounded once: more accurate than torch's kernel."""
    def impl(orig: Impl, x: Any, *a: Any, **kw: Any) -> Any:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or kw:
            return orig(x, *a, **kw)
        wide = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in a]
        return op(x.double(), *wide).to(x.dtype)
    return impl


def _corrupting(orig: Impl, *a: Any, **kw: Any) -> Any:
    out = orig(*a, **kw)
    if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() >= 64:
        factor = torch.ones(out.numel(), dtype=torch.float32)
        factor[7:: 10007] = 1.5
        return (out.float() * factor.reshape(out.shape)).to(out.dtype)
    return out


_ADD, _MUL, _DIV = ("add", "__add__", "__radd__"), ("mul", "__mul__", "__rmul__"), ("div", "__truediv__")

ARMS: list[Arm] = [
    # ---- bugs
    Arm("lowacc-matmul", "bug", "low-precision accumulation (linear/matmul)", _contractions("low")),
    Arm("lowacc-conv", "bug", "low-precision accumulation (conv2d)", {F.conv2d: _conv2d("low")}),
    Arm("sincos-naive", "bug", "sin/cos without range reduction",
        {**torch_forms(_sincos_naive(torch.sin), ("sin",)), **torch_forms(_sincos_naive(torch.cos), ("cos",))}),
    Arm("pow-explog", "bug", "pow as exp(y log x) in the input dtype",
        {**torch_forms(_pow_explog, ("pow", "__pow__")), torch.Tensor.__rpow__: _rpow_explog}),
    Arm("softmax-lownorm", "bug", "softmax with a low-precision normaliser",
        {**torch_forms(_softmax("low"), ("softmax",)), F.softmax: _softmax("low")}),
    Arm("attention-gross", "bug", "attention: 1 element in 10^4 off by 4.6 %",
        {F.scaled_dot_product_attention: _sdpa("gross")}),
    Arm("attention-lownorm", "bug", "attention with a low-precision normaliser",
        {F.scaled_dot_product_attention: _sdpa("lownorm")}),
    Arm("silu-fast", "bug", "silu with a half-precision sigmoid", {F.silu: _silu_fast}),
    Arm("avgpool-lowacc", "bug", "adaptive_avg_pool2d accumulating in low precision",
        {F.adaptive_avg_pool2d: _adaptive_avg_pool2d}),
    Arm("mean-lowacc", "bug", "mean accumulating in low precision", torch_forms(_mean_low, ("mean",))),
    Arm("add-truncate", "bug", "add rounding toward zero",
        {**torch_forms(_truncating(torch.add), _ADD), torch.Tensor.add_: _truncating(torch.add, True),
         torch.Tensor.__iadd__: _truncating(torch.add, True)}),
    Arm("mul-truncate", "bug", "mul rounding toward zero",
        {**torch_forms(_truncating(torch.mul), _MUL), torch.Tensor.mul_: _truncating(torch.mul, True)}),
    Arm("div-truncate", "bug", "div rounding toward zero", torch_forms(_truncating(torch.div), _DIV)),
    Arm("layernorm-eps", "bug", "layer_norm with a wrong epsilon", {F.layer_norm: _layer_norm("eps")}),
    Arm("rsqrt-fast", "bug", "rsqrt in half precision",
        torch_forms(_in_dtype(lambda x: torch.rsqrt(x.to(torch.float16 if x.dtype == torch.float32 else torch.bfloat16))
                       .to(x.dtype)), ("rsqrt",))),
    Arm("gelu-tanh", "bug", "gelu: tanh approximation for the exact form",
        {F.gelu: lambda orig, x, approximate="none": orig(x, approximate="tanh")}),
    Arm("exp-half", "bug", "exp with a half-precision intermediate",
        torch_forms(_in_dtype(lambda x: torch.exp(x.to(torch.float16 if x.dtype == torch.float32 else x.dtype)).to(x.dtype)),
             ("exp",))),
    Arm("corrupt-1e-4", "bug", "one element in 10^4 corrupted (any API)", {"*": _corrupting}),
    # ---- correct variants unlike torch's kernels
    Arm("splitk-matmul", "variant", "split-K fp32 accumulation (linear/matmul)", _contractions("splitk")),
    Arm("unfused-bias-linear", "variant", "linear as a split-K matmul, then the bias added in the output dtype",
        {F.linear: _linear("splitk", unfused=True)}),
    Arm("fp64-matmul", "variant", "fp64 accumulation (linear/matmul)", _contractions("fp64")),
    Arm("im2col-conv", "variant", "conv2d as im2col + split-K fp32 matmul", {F.conv2d: _conv2d("splitk")}),
    Arm("flash-attention", "variant", "flash-style attention (fp32 scores, P rounded to the input dtype)",
        {F.scaled_dot_product_attention: _sdpa("flash")}),
    Arm("softmax-lse", "variant", "softmax as exp(x - logsumexp)",
        {**torch_forms(_softmax("lse"), ("softmax",)), F.softmax: _softmax("lse")}),
    Arm("softmax-fp64", "variant", "softmax in fp64", {**torch_forms(_softmax("fp64"), ("softmax",)),
                                                        F.softmax: _softmax("fp64")}),
    Arm("layernorm-twopass", "variant", "layer_norm two-pass in fp32", {F.layer_norm: _layer_norm("twopass")}),
    Arm("layernorm-rounded", "variant", "layer_norm: normalised value rounded, affine in the storage dtype",
        {F.layer_norm: _layer_norm("rounded")}),
    Arm("accurate-elementwise", "variant", "elementwise maths in fp64",
        {**torch_forms(_fp64(torch.exp), ("exp",)), **torch_forms(_fp64(torch.sin), ("sin",)),
         **torch_forms(_fp64(torch.cos), ("cos",)), **torch_forms(_fp64(torch.rsqrt), ("rsqrt",)),
         **torch_forms(_fp64(torch.sqrt), ("sqrt",)), F.silu: _fp64(F.silu), F.gelu: _fp64(F.gelu),
         **torch_forms(_fp64(torch.pow), ("pow", "__pow__")), **torch_forms(_fp64(torch.mul), ("__mul__", "mul")),
         **torch_forms(_fp64(torch.div), _DIV), **torch_forms(_fp64(torch.add), ("__add__", "add"))}),
    Arm("accurate-reduction", "variant", "reductions in fp64",
        {**torch_forms(_fp64(torch.mean), ("mean",)), **torch_forms(_fp64(torch.sum), ("sum",)),
         F.layer_norm: _layer_norm("fp64")}),
]
