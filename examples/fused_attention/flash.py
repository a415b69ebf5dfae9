"""Two flash-attention kernels for NPU.npu_fusion_attention items (BNSD or BSND, no mask, no GQA), as
a kernel author would check them against a dump before porting them to the device.

`flash_attention` is sound: fp32 scores, a running row max and row sum over 128-key tiles, and the
probabilities rounded to the input dtype before the product with V, as flash kernels do.
`flash_attention_bf16_rowsum` has the bug this example is about: its row sum is kept in the input
dtype. Both are differentiable through torch's autograd, so backward items check them too.
"""
from __future__ import annotations

import torch

TILE = 128


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, low_rowsum: bool) -> torch.Tensor:
    """q, k, v: (B, N, S, D) in a 16-bit dtype -> (B, N, S, D) in that dtype."""
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    m = torch.full(q.shape[:-1], float("-inf"))
    ell = torch.zeros(q.shape[:-1])
    acc = torch.zeros_like(q)
    for j in range(0, k.shape[-2], TILE):
        s = q @ k[..., j:j + TILE, :].transpose(-1, -2) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new.unsqueeze(-1))
        ell = ell * alpha + p.sum(-1)
        if low_rowsum:  # the bug: the running row sum stored in the input dtype
            ell = ell.to(dtype).float()
        acc = acc * alpha.unsqueeze(-1) + p.to(dtype).float() @ v[..., j:j + TILE, :]
        m = m_new
    return (acc / ell.unsqueeze(-1)).to(dtype)


def _attention(low_rowsum: bool):  # type: ignore[no-untyped-def]
    def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,  # type: ignore[no-untyped-def]
                             atten_mask=None, scale=1.0, keep_prob=1.0, *args, **kwargs):
        if input_layout not in ("BNSD", "BSND") or atten_mask is not None or pse is not None or keep_prob != 1.0:
            raise NotImplementedError(f"this example kernel takes BNSD/BSND without masks, not {input_layout}")
        bnsd = input_layout == "BNSD"
        q, k, v = (x if bnsd else x.transpose(1, 2) for x in (query, key, value))
        out = _flash(q, k, v, scale, low_rowsum)
        out = out if bnsd else out.transpose(1, 2)
        empty = query.new_empty(0)
        return out, empty, empty, empty, 0, 0, 0  # only attention_out is compared (api_specs/apis.yaml)

    return npu_fusion_attention


flash_attention = _attention(low_rowsum=False)
flash_attention_bf16_rowsum = _attention(low_rowsum=True)
