"""`--msprobe-jit-compile on|off` and `--msprobe-allow-internal-format on|off`: the options, their
value on config.stash and the report header line; runs/npu_runtime.py applies them."""
from __future__ import annotations

from typing import Any

import pytest

from ..runs.npu_runtime import NpuRuntime

RUNTIME_KEY = pytest.StashKey["NpuRuntime | None"]()
CHOICES = ("on", "off")


def addoption(group: Any) -> None:
    group.addoption("--msprobe-jit-compile", choices=CHOICES, default=None,
                    help="NPU: torch_npu.npu.set_compile_mode(jit_compile=on|off) before items run (msprobe run_ut "
                         "-j); also sets allow_internal_format to the same value unless that option is given")
    group.addoption("--msprobe-allow-internal-format", choices=CHOICES, default=None,
                    help="NPU: torch.npu.config.allow_internal_format = on|off before items run")


def configure(config: pytest.Config) -> NpuRuntime | None:
    jit = config.getoption("msprobe_jit_compile", None)
    internal = config.getoption("msprobe_allow_internal_format", None)
    if jit is None and internal is None:
        runtime = None
    else:
        internal = internal if internal is not None else jit  # msprobe sets both from -j
        runtime = NpuRuntime(None if jit is None else jit == "on", None if internal is None else internal == "on")
    config.stash[RUNTIME_KEY] = runtime
    return runtime


def header(config: pytest.Config) -> str | None:
    runtime = config.stash.get(RUNTIME_KEY, None)
    if runtime is None:
        return None
    from ..npu_import import npu_import_error

    error = npu_import_error()
    if error is not None:
        return (f"msprobe: NPU runtime {runtime.describe()} not applied: torch_npu cannot be imported here "
                f"({error}); the settings only matter for items running on an NPU")
    return f"msprobe: NPU runtime {runtime.describe()} (applied in each process that runs items on the NPU)"
