"""Activations: npu_fast_gelu, npu_swiglu, npu_mish, npu_scaled_masked_softmax (+ backwards).

Sources:
[FG]  torch_npu docs, torch_npu.npu_fast_gelu (Ascend/op-plugin docs/context/torch_npu-npu_fast_gelu.md) 计算公式:
      Atlas A2/A3: x / (1 + e^(-1.702 x)); the Atlas-training form x e^(0.851 (x - |x|)) / (1 + e^(-1.702 |x|)) is
      the same function written without overflow. torch_npu.fast_gelu is the same op (api_specs alias).
[SW]  torch_npu "fused operator API replacement" guide, torch_npu.npu_swiglu: silu(chunk 0) * chunk 1 along dim
      (default -1); backward schema npu_swiglu_backward(grad_output, self, dim=-1).
[MI]  torch_npu docs, torch_npu.npu_mish(self): x * tanh(softplus(x)).
[SMS] torch_npu docs, torch_npu.npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False): softmax
      over the last dim of x*scale with mask==True positions removed; fixed_triu_mask is reserved, only False is
      supported. The replacement guide's equivalent is softmax((x*scale).masked_fill(mask, -inf)).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import BenchUnsupported

FAST_GELU_K = 1.702  # [FG] 计算公式


def npu_fast_gelu(self: torch.Tensor) -> torch.Tensor:
    """[FG] x * sigmoid(1.702 x); torch.sigmoid is stable for large |x|."""
    return self * torch.sigmoid(FAST_GELU_K * self)


def npu_fast_gelu_backward(grad: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    """d/dx [x s(kx)] = s(kx) + k x s(kx) (1 - s(kx))."""
    s = torch.sigmoid(FAST_GELU_K * self)
    return grad * (s + FAST_GELU_K * self * s * (1 - s))


def npu_swiglu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:  # [SW] dim default -1
    """[SW] silu(a) * b with a, b the two halves of `input` along `dim`."""
    a, b = torch.chunk(input, 2, dim=dim)
    return F.silu(a) * b


def npu_swiglu_backward(grad_output: torch.Tensor, self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """d a = g * b * silu'(a), d b = g * silu(a), concatenated back along `dim`."""
    a, b = torch.chunk(self, 2, dim=dim)
    s = torch.sigmoid(a)
    return torch.cat((grad_output * b * s * (1 + a * (1 - s)), grad_output * a * s), dim=dim)


def npu_mish(self: torch.Tensor) -> torch.Tensor:
    """[MI] x * tanh(softplus(x))."""
    return self * torch.tanh(F.softplus(self))


def npu_scaled_masked_softmax(x: torch.Tensor, mask: torch.Tensor, scale: float = 1.0,
                              fixed_triu_mask: bool = False,  # [SMS] defaults scale=1.0, fixed_triu_mask=False
                              ) -> torch.Tensor:
    """[SMS] softmax(x * scale) over the last dim with masked positions removed; output dtype of x."""
    if fixed_triu_mask:
        raise BenchUnsupported("npu_scaled_masked_softmax(fixed_triu_mask=True): reserved, torch_npu supports False")
    keep = ~mask.bool()
    if not bool(keep.any(-1).all()):
        raise BenchUnsupported("npu_scaled_masked_softmax: a row is entirely masked; its output is not documented")
    z = (x.to(torch.promote_types(x.dtype, torch.float32)) * scale).masked_fill(~keep, float("-inf"))
    return torch.softmax(z, dim=-1).to(x.dtype)


def npu_scaled_masked_softmax_backward(y_grad: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, scale: float = 1.0,
                                       fixed_triu_mask: bool = False) -> torch.Tensor:
    """dx = scale * y * (g - rowsum(g * y)); masked positions have y = 0 and get 0."""
    if fixed_triu_mask:
        raise BenchUnsupported("npu_scaled_masked_softmax_backward(fixed_triu_mask=True): reserved in torch_npu")
    ct = torch.promote_types(y.dtype, torch.float32)
    g, p = y_grad.to(ct), y.to(ct)
    dx = scale * p * (g - (g * p).sum(-1, keepdim=True))
    return dx.masked_fill(mask.bool(), 0.0).to(y_grad.dtype)


# In the device dtype, as eager torch computes `F.silu(a) * b` (silu rounded to the input dtype, then
# the product): the `strict` standard's third run (api_specs/bench_functions.yaml `rounded`).

def npu_swiglu_rounded(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    a, b = torch.chunk(input, 2, dim=dim)
    return F.silu(a) * b


def npu_swiglu_backward_rounded(grad_output: torch.Tensor, self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The eager autograd of npu_swiglu_rounded, in the input dtype."""
    a, b = torch.chunk(self.detach(), 2, dim=dim)
    with torch.enable_grad():
        a = a.requires_grad_(True)
        silu = F.silu(a)
        da, = torch.autograd.grad(silu * b, a, grad_output.to(self.dtype))
    return torch.cat((da, grad_output.to(self.dtype) * silu.detach()), dim=dim)
