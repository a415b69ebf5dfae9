"""The size of the terms of sums whose API on |inputs| is not that size, because a subtraction sits inside.

softmax's backward is y * (g - sum(g * y)): the API on |g| and |y| subtracts the sums too, so where g
cancels against the sum it would report a tiny size, while any order of adding the sum moves the
element by u * y * sum(|g * y|). Each function here takes the call's own (signed) arguments, in fp32
or fp64, and returns that size per element: the magnitude run of these APIs (api_specs/error_model.yaml
`term_sizes`), which `sums.accumulation_factor` scales as for every other sum.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def softmax_backward_data(grad_output: torch.Tensor, output: torch.Tensor, dim: int, *_: Any) -> torch.Tensor:
    """|y| * (|g| + sum(|g * y|)): the two terms of each element and the terms of the row's sum."""
    g, y = grad_output.abs(), output.abs()
    return y * (g + (g * y).sum(dim, keepdim=True))


def log_softmax_backward_data(grad_output: torch.Tensor, output: torch.Tensor, dim: int, *_: Any) -> torch.Tensor:
    """|g| + exp(y) * sum(|g|): the gradient minus the probabilities times the row's sum of it."""
    g = grad_output.abs()
    return g + output.exp() * g.sum(dim, keepdim=True)


TERM_SIZES: dict[str, Callable[..., torch.Tensor]] = {
    "softmax_backward_data": softmax_backward_data,
    "log_softmax_backward_data": log_softmax_backward_data,
}


def term_size_fn(api: str, specs: dict[str, Any]) -> Callable[..., torch.Tensor] | None:
    """The term-size function error_model.yaml `term_sizes` names for `api`, or None (the API on |inputs|)."""
    name = specs["error_model"].get("term_sizes", {}).get(api)
    return TERM_SIZES[name] if name else None
