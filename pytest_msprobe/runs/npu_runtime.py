"""msprobe's NPU runtime settings (session/npu_options.py reads them): ini `msprobe_jit_compile on|off`
and `msprobe_allow_internal_format on|off` (msprobe run_ut's `-j`, which sets both).

They use torch_npu's documented switches, `torch_npu.npu.set_compile_mode(jit_compile=...)` and
`torch.npu.config.allow_internal_format = ...`, once per process that runs items on the NPU (the npu
backend applies them the first time it is selected). msprobe's FAQ: the setting should match the training
run's, or kernels and tensor formats differ. Without torch_npu nothing is applied and the report header
says why. Torch-free at import.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class NpuRuntime:
    jit_compile: bool | None
    allow_internal_format: bool | None

    def describe(self) -> str:
        shown = [f"{k}={'on' if v else 'off'}" for k, v in (("jit_compile", self.jit_compile),
                                                           ("allow_internal_format", self.allow_internal_format))
                 if v is not None]
        return ", ".join(shown)


@functools.cache
def apply(runtime: NpuRuntime) -> str | None:
    """Set the switches once per process; the reason they cannot be set, or None."""
    from ..npu_import import npu_import_error

    error = npu_import_error()
    if error is not None:
        return f"torch_npu cannot be imported ({error}), so {runtime.describe()} cannot be set"
    import torch
    import torch_npu

    try:
        if runtime.jit_compile is not None:
            torch_npu.npu.set_compile_mode(jit_compile=runtime.jit_compile)
        if runtime.allow_internal_format is not None:
            torch.npu.config.allow_internal_format = runtime.allow_internal_format  # type: ignore[attr-defined]
    except Exception as exc:  # an older torch_npu without one of the switches
        return f"torch_npu refused {runtime.describe()}: {type(exc).__name__}: {exc}"
    return None


__all__ = ["NpuRuntime", "apply"]
