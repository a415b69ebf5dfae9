"""Optimizer steps: npu_apply_adam_w, npu_apply_adam. Both update out=(var, m, v) in place and return it.

Sources:
[AW] torch_npu docs, torch_npu.npu_apply_adam_w (计算公式): m' = b1 m + (1-b1) g, v' = b2 v + (1-b2) g^2,
     denom = sqrt(max(max_grad_norm, v') | v' / (1 - beta2_power * b2)) + eps,
     var' = var (1 - lr wd) - lr (m' / (1 - beta1_power * b1)) / denom, g = -grad when maximize.
     So beta*_power is beta^(t-1): the op multiplies it by beta once more. max_grad_norm "当amsgrad为True时必须传入";
     amsgrad/maximize None mean False.
[AD] torch_npu docs, torch_npu.npu_apply_adam(beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad,
     use_locking, use_nesterov, out=(var, m, v)) names the arguments of the Ascend ApplyAdam op; the page gives no
     formula. ApplyAdam is TensorFlow's op (tf.raw_ops.ApplyAdam): lr_t = lr sqrt(1 - beta2_power) /
     (1 - beta1_power), m' = m + (1-b1)(g - m), v' = v + (1-b2)(g^2 - v),
     var' = var - lr_t m' / (sqrt(v') + eps), nesterov: var - lr_t (b1 m' + (1-b1) g) / (sqrt(v') + eps).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _state(out: Sequence[torch.Tensor] | None) -> Sequence[torch.Tensor]:
    if out is None or len(out) != 3:
        raise ValueError("out=(var, m, v) is required")
    return out


def _write(out: Sequence[torch.Tensor], *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        for dst, src in zip(out, values):
            dst.copy_(src)
    return tuple(out)


def npu_apply_adam_w(beta1_power: Any, beta2_power: Any, lr: Any, weight_decay: Any, beta1: Any, beta2: Any,
                     epsilon: Any, grad: torch.Tensor, max_grad_norm: torch.Tensor | None = None,
                     amsgrad: bool | None = None, maximize: bool | None = None, *,
                     out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """[AW] one AdamW step; amsgrad uses the given max_grad_norm (msprobe's bench overwrites it with noise)."""
    state = _state(out)
    var, m, v = state
    g = -grad if maximize else grad
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    if amsgrad:
        if max_grad_norm is None:
            raise ValueError("npu_apply_adam_w: amsgrad=True needs max_grad_norm")
        second = torch.maximum(max_grad_norm, v_new)
    else:
        second = v_new
    denom = torch.sqrt(second / (1 - beta2_power * beta2)) + epsilon
    var_new = var * (1 - lr * weight_decay) - lr * (m_new / (1 - beta1_power * beta1)) / denom
    return _write(state, var_new, m_new, v_new)


def npu_apply_adam(beta1_power: Any, beta2_power: Any, lr: Any, beta1: Any, beta2: Any, epsilon: Any,
                   grad: torch.Tensor, use_locking: bool = False, use_nesterov: bool = False, *,
                   out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """[AD] one Adam step, beta*_power = beta^t as in ApplyAdam."""
    state = _state(out)
    var, m, v = state
    m_new = m + (1 - beta1) * (grad - m)
    v_new = v + (1 - beta2) * (grad * grad - v)
    lr_t = lr * (1 - beta2_power) ** 0.5 / (1 - beta1_power)
    step = beta1 * m_new + (1 - beta1) * grad if use_nesterov else m_new
    return _write(state, var - lr_t * step / (torch.sqrt(v_new) + epsilon), m_new, v_new)
