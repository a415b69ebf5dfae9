"""ini `msprobe_jit_compile on|off` and `msprobe_allow_internal_format on|off` (session/ini_keys.py): their
value on config.stash and the report header line; runs/npu_runtime.py applies them."""
from __future__ import annotations

import pytest

from ..runs.npu_runtime import NpuRuntime
from . import ini_keys

RUNTIME_KEY = pytest.StashKey["NpuRuntime | None"]()


def configure(config: pytest.Config) -> NpuRuntime | None:
    jit = ini_keys.value(config, "msprobe_jit_compile")
    internal = ini_keys.value(config, "msprobe_allow_internal_format")
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
