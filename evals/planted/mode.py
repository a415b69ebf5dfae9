"""Arming one arm: a TorchFunctionMode that sends each replaced torch function of a call whose first float
tensor has the armed dtype to the arm's implementation (under CPU autocast, with the inputs autocast gives it).

The plugin arms it inside `pytest_msprobe_device_call`; the scripts and the self-check arm it in-process."""
from __future__ import annotations

from typing import Any


def first_float_dtype(args: Any, kwargs: Any) -> Any:
    """The dtype of the first floating-point tensor among the arguments (lists searched), None without one."""
    import torch

    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype
        if isinstance(value, (list, tuple)):
            found = first_float_dtype(value, {})
            if found is not None:
                return found
    return None


def armed_mode(arm: Any, dtype: Any) -> Any:
    """A mode that runs `arm`'s replacements for calls of `dtype` while it is entered."""
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
                    return func(*args, **kwargs) if first_float_dtype(args, kwargs) != dtype else \
                        impl(func, *args, **kwargs)
            if first_float_dtype(args, kwargs) != dtype:
                return func(*args, **kwargs)
            return impl(func, *args, **kwargs)

    return Armed()
