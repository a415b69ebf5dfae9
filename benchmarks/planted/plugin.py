"""pytest plugin arming one planted bug or correct variant inside the device-call boundary.

    PLANTED_ARM=lowacc-matmul PLANTED_DTYPE=torch.bfloat16 pytest -p benchmarks.planted.plugin dump.json

Only the device call (`pytest_msprobe_device_call`) sees the arm: the bench and every other run of
the checker use torch's own kernels. Calls whose first float tensor is not of PLANTED_DTYPE run as usual.
"""
from __future__ import annotations

import os
from typing import Any

import pytest


def _first_float_dtype(args: Any, kwargs: Any) -> Any:
    import torch

    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype
        if isinstance(value, (list, tuple)):
            found = _first_float_dtype(value, {})
            if found is not None:
                return found
    return None


def _mode(arm: Any, dtype: Any) -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    class Armed(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            impl = arm.impls.get(func) or arm.impls.get("*")
            if impl is None:
                return func(*args, **kwargs)
            if torch.is_autocast_enabled("cpu"):  # the kernel gets what autocast would give it
                low = torch.get_autocast_dtype("cpu")
                args = tuple(a.to(low) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args)
                with torch.autocast("cpu", enabled=False):
                    return func(*args, **kwargs) if _first_float_dtype(args, kwargs) != dtype else \
                        impl(func, *args, **kwargs)
            if _first_float_dtype(args, kwargs) != dtype:
                return func(*args, **kwargs)
            return impl(func, *args, **kwargs)

    return Armed()


@pytest.hookimpl(hookwrapper=True)
def pytest_msprobe_device_call(item_name: str, api: str, phase: str, device: Any, call: Any) -> Any:
    name = os.environ.get("PLANTED_ARM")
    if not name or phase != "forward":  # the backward runs the armed forward's autograd graph
        yield
        return
    import torch

    from benchmarks.planted.arms import BY_NAME

    dtype = getattr(torch, os.environ.get("PLANTED_DTYPE", "torch.float32").split(".")[1])
    with _mode(BY_NAME[name], dtype):
        yield
