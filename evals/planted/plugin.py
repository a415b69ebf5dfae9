"""pytest plugin arming one planted bug or correct variant inside the device-call boundary.

    PLANTED_ARM=lowacc-matmul PLANTED_DTYPE=torch.bfloat16 pytest -p evals.planted.plugin dump.json

Only the device call (`pytest_msprobe_device_call`) sees the arm: the bench and every other run of
the checker use torch's own kernels. Calls whose first float tensor is not of PLANTED_DTYPE run as usual.
"""
from __future__ import annotations

import os
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_msprobe_device_call(item_name: str, api: str, phase: str, device: Any, call: Any) -> Any:
    name = os.environ.get("PLANTED_ARM")
    if not name or phase != "forward":  # the backward runs the armed forward's autograd graph
        yield
        return
    import torch

    from evals.planted.mode import armed_mode
    from evals.planted.registry import BY_NAME

    dtype = getattr(torch, os.environ.get("PLANTED_DTYPE", "torch.float32").split(".")[1])
    with armed_mode(BY_NAME[name], dtype):
        yield
