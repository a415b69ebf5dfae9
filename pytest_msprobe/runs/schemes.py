"""The vendor kernels' accumulation schemes that a contract names (api_specs/contracts.yaml `schemes`).

A kernel that rounds partial sums into its output's dtype loses up to one unit roundoff of that dtype of each
running sum it rounds, which no order of fp32 additions covers: PyTorch's CUDA embedding backward adds each block
of 32 indices into the bf16 gradient. The scheme's size of an element is the sum of the sizes of its running sums,
block after block (computed here in fp64 from the indices and the recorded gradient), in units of fp32's roundoff
times the output dtype's: the strict thresholds' `blocked_sums` section then allows one rounding of each, the
first-order bound of the scheme, and nothing more. A row added in one block keeps one rounding of its value.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .execution import UNIT_ROUNDOFF
from .third_run import Summed

SIXTEEN_BITS = (torch.bfloat16, torch.float16)  # the weights' dtypes a blocked scheme rounds into


def scheme(specs: Mapping[str, Any], contract: str, api: str) -> Mapping[str, Any] | None:
    """The contract's named scheme of this API's kernel, or None."""
    found: Mapping[str, Any] | None = (specs.get("contracts", {}).get(contract) or {}).get("schemes", {}).get(api)
    return found


def blocked(summed: Summed, specs: Mapping[str, Any], contract: str, api: str, call: tuple[list[Any], dict[str, Any]],
            cotangents: list[Any]) -> Summed:
    """A backward item's magnitude run under a blocked scheme (embedding's): its weight gradient sized by the running
    sums the scheme rounds; the run as it was where no scheme applies to this call (`call`: its args, kwargs)."""
    rule = scheme(specs, contract, api)
    args, kwargs = call
    if rule is None or any(kwargs.get(name, args[at] if len(args) > at else None)
                           for name, at in (rule.get("unless") or {}).items()):
        return summed
    indices = next((a for a in args if isinstance(a, torch.Tensor) and not a.is_floating_point()), None)
    weight = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
    grad = cotangents[0] if cotangents and isinstance(cotangents[0], torch.Tensor) else None
    if not summed.positions or indices is None or weight is None or grad is None or \
            weight.dim() != 2 or weight.dtype not in SIXTEEN_BITS or \
            not 0 < indices.numel() <= int(rule["max_indices"]) or grad.numel() != indices.numel() * weight.shape[1]:
        return summed
    sizes = running_sizes(indices.detach().reshape(-1).long().cpu(), grad.detach().cpu().double().reshape(
        indices.numel(), -1), weight.shape[0], int(rule["block"]))
    unit = UNIT_ROUNDOFF[weight.dtype] / UNIT_ROUNDOFF[torch.float32]  # strict's factor multiplies fp32's
    return Summed(summed.run, "blocked_sums", summed.positions, (sizes * unit).to(torch.float32))


def running_sizes(indices: torch.Tensor, rows: torch.Tensor, num: int, block: int) -> torch.Tensor:
    """Per element of the [num, width] sum of `rows` at `indices`, the sum of the sizes of its running sums after
    each block of `block` indices that adds into it (fp64)."""
    running = torch.zeros(num, rows.shape[1], dtype=torch.float64)
    sizes = torch.zeros_like(running)
    for start in range(0, indices.numel(), block):
        at = indices[start:start + block]
        running.index_add_(0, at.clamp(0, num - 1), rows[start:start + block])
        touched = torch.unique(at.clamp(0, num - 1))
        sizes[touched] += running[touched].abs()
    return sizes
