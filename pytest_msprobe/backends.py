"""The public path of the device-backend API (`from pytest_msprobe.backends import Backend`).

The code lives in `runs/backends.py` (and its pytest side in `session/device_hooks.py`); this module
only re-exports it, so conftest.py files and
device plugins written against the documented path keep working.
"""
from __future__ import annotations

from .runs.backends import (
    AUTO,
    BUILTIN,
    ENTRY_POINT_GROUP,
    Backend,
    BackendError,
    CpuBackend,
    CudaBackend,
    DeviceCall,
    NpuBackend,
    builtin_backend,
    device_call,
    entry_point_names,
    load_entry_point,
    lookup,
    runner,
    select,
)
from .session.device_hooks import activate, check_name, known_names

__all__ = [
    "AUTO", "BUILTIN", "Backend", "BackendError", "CpuBackend", "CudaBackend", "DeviceCall", "ENTRY_POINT_GROUP",
    "NpuBackend", "activate", "builtin_backend", "check_name", "device_call", "entry_point_names", "known_names",
    "load_entry_point", "lookup", "runner", "select",
]
