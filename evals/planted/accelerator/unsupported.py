"""not-implemented: dtypes with no kernel on the device (as on an H100), raised as torch raises them; a
checker must report a skip.
"""
from __future__ import annotations

from typing import Any

import torch

from evals.planted.accelerator.numerics import (
    SIXTEEN,
)
from evals.planted.arm import Arm, Impl, torch_forms

_C10 = {torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float32: "Float"}


def _no_kernel(kernel: str, dtypes: tuple[torch.dtype, ...]) -> Impl:
    """A dtype the device has no kernel for: torch's dispatch error, as an H100 raised it."""
    def impl(orig: Impl, *a: Any, **kw: Any) -> Any:
        first = next((t for t in a if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        if first is None or first.dtype not in dtypes:
            return orig(*a, **kw)
        raise RuntimeError(f'"{kernel}" not implemented for \'{_C10[first.dtype]}\'')
    return impl


def _no_backend(op: str) -> Impl:
    def impl(orig: Impl, *a: Any, **kw: Any) -> Any:
        raise NotImplementedError(f"Could not run 'aten::{op}' with arguments from the 'CUDA' backend. This could be "
                                  "because the operator doesn't exist for this backend.")
    return impl


NOT_IMPLEMENTED = Arm("not-implemented", "unsupported", "no kernel for the dtype (as on an H100): RuntimeError, NotImplementedError",
        {**torch_forms(_no_kernel("angle_cuda", SIXTEEN), ("angle",)),
         **torch_forms(_no_kernel("histogram_cuda", SIXTEEN), ("histc",)),
         **torch_forms(_no_kernel("igamma_cuda", SIXTEEN), ("igamma", "igamma_")),
         **torch_forms(_no_kernel("igammac_cuda", SIXTEEN), ("igammac", "igammac_")),
         **torch_forms(_no_backend("histogram.bin_ct"), ("histogram",)),
         **torch_forms(_no_backend("_histogramdd_bin_edges"), ("histogramdd",))})
