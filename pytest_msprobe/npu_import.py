"""torch_npu, imported once per process; the reason when it cannot be.

At the bottom of the package because three stages ask it: the backends (is the npu device usable),
the NPU runtime switches and the API-name check of api_specs overrides.
"""
from __future__ import annotations

import functools
import importlib


@functools.lru_cache(maxsize=1)
def npu_import_error() -> str | None:
    """Import torch_npu once; without CANN it raises, which must become a skip reason."""
    try:
        importlib.import_module("torch_npu")
    except BaseException as exc:  # ImportError, OSError from missing CANN libraries, SystemExit, ...
        return f"{type(exc).__name__}: {exc}".strip()
    return None
