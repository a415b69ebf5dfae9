"""Normalisations: npu_rms_norm (+ backward), npu_add_rms_norm, npu_layer_norm_eval, npu_group_norm_silu.

Sources:
[RMS]  torch_npu docs, torch_npu.npu_rms_norm: `npu_rms_norm(self, gamma, epsilon=1e-06) -> (Tensor, Tensor)`;
       gamma "shape要求与x的后几维保持一致"; the 2nd output is rstd (float32), the RmsNorm IR's `rstd` output.
[RMSB] torch_npu schema npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (dx, dgamma).
[ARMS] torch_npu docs, torch_npu.npu_add_rms_norm: `(x1, x2, gamma, epsilon=1e-06) -> (y, rstd, x)`, x = x1 + x2,
       rstd float32 keeping the normalised dims as 1 (e.g. x (2,3,4,8), gamma (4,8) -> rstd (2,3,1,1)).
[LNE]  torch_npu docs, torch_npu.npu_layer_norm_eval(input, normalized_shape, weight=None, bias=None,
       eps=1e-05): "与torch.nn.functional.layer_norm相同".
[GNS]  torch_npu docs, torch_npu.npu_group_norm_silu(input, weight, bias, group, eps=0.00001) -> (out, meanOut,
       rstdOut); meanOut/rstdOut shape (N, group), same dtype as input.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """At least float32: the NPU kernels accumulate fp16/bf16 in fp32; the bench's fp64 stays fp64."""
    return torch.promote_types(t.dtype, torch.float32)


def _rms(x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    xc = x.to(_compute_dtype(x))
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))  # [RMS] gamma covers the trailing dims it has
    rstd = torch.rsqrt(xc.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (xc * rstd * gamma).to(x.dtype), rstd


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor,
                 epsilon: float = 1e-6,  # [RMS] 接口原型 epsilon=1e-06 (msprobe's bench wrongly defaults to 1e-5)
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rsqrt(mean(x^2) + eps) * gamma over gamma's dims; rstd is float32 as on the NPU."""
    y, rstd = _rms(self, gamma, epsilon)
    return y, rstd.float()


def npu_rms_norm_backward(dy: torch.Tensor, self: torch.Tensor, gamma: torch.Tensor,
                          rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[RMSB] dx and dgamma from the saved rstd; dgamma sums over every non-gamma dim (msprobe forgot to)."""
    ct = _compute_dtype(self)
    x, g, r, gam = self.to(ct), dy.to(ct), rstd.to(ct), gamma.to(ct)
    lead = self.dim() - gamma.dim()
    dims = tuple(range(lead, self.dim()))
    xhat = x * r
    dgamma = (g * xhat).sum(dim=tuple(range(lead))) if lead else g * xhat
    gg = g * gam
    dx = r * (gg - xhat * (gg * xhat).mean(dim=dims, keepdim=True))
    return dx.to(self.dtype), dgamma.to(gamma.dtype)


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                     epsilon: float = 1e-6,  # [ARMS] 函数原型 epsilon=1e-06
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[ARMS] x = x1 + x2, then RmsNorm(x) * gamma -> (y, rstd float32, x)."""
    x = x1 + x2
    y, rstd = _rms(x, gamma, epsilon)
    return y, rstd.float(), x


def npu_layer_norm_eval(input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None,
                        eps: float = 1e-5,  # [LNE] 函数原型 eps=1e-05
                        ) -> torch.Tensor:
    """[LNE] torch.nn.functional.layer_norm, weight/bias/eps included (msprobe's bench drops all three)."""
    return F.layer_norm(input, list(normalized_shape), weight, bias, eps)


def npu_group_norm_silu(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, group: int,
                        eps: float = 1e-5,  # [GNS] 函数原型 eps=0.00001
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[GNS] silu(group_norm(input)) with the per-(sample, group) mean and 1/sqrt(var + eps) (biased var)."""
    n, c = input.shape[0], input.shape[1]
    x = input.to(_compute_dtype(input)).reshape(n, group, -1)
    mean = x.mean(-1)
    rstd = torch.rsqrt(x.var(-1, unbiased=False) + eps)
    y = ((x - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)).reshape(input.shape)
    per_channel = (1, c) + (1,) * (input.dim() - 2)
    if weight is not None:
        y = y * weight.view(per_channel)
    if bias is not None:
        y = y + bias.view(per_channel)
    return F.silu(y).to(input.dtype), mean.to(input.dtype), rstd.to(input.dtype)


# ----------------------------------------------------------------------------- in the device dtype
# What a sound 16-bit kernel may round (the `strict` standard's third run, api_specs/bench_functions.yaml
# `rounded`): Hugging Face's LlamaRMSNorm computes the statistics in fp32, rounds the normalised value
# to the input dtype and multiplies by gamma in that dtype; its autograd rounds dy * gamma likewise.

def _rms_rounded(x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    xc = x.to(_compute_dtype(x))
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(xc.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return gamma.to(x.dtype) * (xc * rstd).to(x.dtype), rstd


def npu_rms_norm_rounded(self: torch.Tensor, gamma: torch.Tensor,
                         epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    y, rstd = _rms_rounded(self, gamma, epsilon)
    return y, rstd.float()


def npu_add_rms_norm_rounded(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                             epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x1 + x2
    y, rstd = _rms_rounded(x, gamma, epsilon)
    return y, rstd.float(), x


def npu_rms_norm_backward_rounded(dy: torch.Tensor, self: torch.Tensor, gamma: torch.Tensor,
                                  rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The autograd of npu_rms_norm_rounded: dy * gamma and the normalised value in the input dtype."""
    ct = _compute_dtype(self)
    x, r = self.to(ct), rstd.to(ct)
    lead = self.dim() - gamma.dim()
    dims = tuple(range(lead, self.dim()))
    xhat = x * r
    low = xhat.to(self.dtype)
    dgamma = (dy * low).sum(dim=tuple(range(lead))) if lead else dy * low
    gg = (dy * gamma.to(dy.dtype)).to(ct)
    dx = r * (gg - xhat * (gg * xhat).mean(dim=dims, keepdim=True))
    return dx.to(self.dtype), dgamma.to(gamma.dtype)


def npu_group_norm_silu_rounded(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                                group: int, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager `F.silu(F.group_norm(x))` in the input dtype: the normalised, scaled value rounded to it before
    silu (fp32 statistics inside torch's kernel); mean and rstd as the reference's. Its autograd is eager
    torch's in that dtype."""
    low = input.dtype
    y = F.group_norm(input, group, None if weight is None else weight.to(low), None if bias is None else bias.to(low),
                     eps)
    _, mean, rstd = npu_group_norm_silu(input.detach(), weight, bias, group, eps)
    return F.silu(y), mean, rstd
