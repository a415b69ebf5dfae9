"""Hooks pytest-msprobe calls, for plugins and conftest.py files (added in `plugin.pytest_addhooks`).

Two kinds:

* **Device backends** — `pytest_msprobe_device` returns the `Backend` that `--msprobe-device NAME`
  selects; `pytest_msprobe_device_names` lists the names a plugin provides (for the usage error and
  the header). The built-in `npu`, `cuda` and `cpu` devices come through the same hooks (from a
  `trylast` implementation that also loads the `pytest_msprobe.devices` entry points), so a
  conftest.py or a plugin can add a device or replace a built-in one.
* **The boundary** — `pytest_msprobe_device_call` runs exactly the device call of one item
  (forward, and separately the backward of a backward item). Wrap it to instrument the device under
  test: input generation, the bench, the reference runs and the metrics never run inside it.

Every hook runs in the process that runs the items (an xdist worker, or the only process); the
device hooks run at configure time too, to validate `--msprobe-device`, where they must not
import torch (construct the backend, import torch in its methods).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .runs.backends import Backend, DeviceCall

hookspec = pytest.hookspec


@hookspec(firstresult=True)
def pytest_msprobe_device(config: pytest.Config, name: str) -> Backend | None:
    """Return the backend for `--msprobe-device NAME` (or `--msprobe-reference NAME`), or None.

    The first non-None result wins; conftest.py files and plugins come before the entry points of
    the group `pytest_msprobe.devices`, which come before the built-in `npu`, `cuda` and `cpu`.
    The result must be an instance of `pytest_msprobe.backends.Backend`. Called when pytest
    configures (creating the backend must not import torch) and once per process at run time.

    .. code-block:: python

        from pytest_msprobe.runs.backends import Backend

        class MyDevice(Backend):
            name, kind = "mydev", "privateuseone"

            def synchronize(self, device):
                import my_runtime; my_runtime.synchronize()

        def pytest_msprobe_device(config, name):
            return MyDevice() if name == "mydev" else None

        def pytest_msprobe_device_names(config):
            return ["mydev"]
    """


def pytest_msprobe_device_names(config: pytest.Config) -> Iterable[str]:  # type: ignore[empty-body]  # a spec
    """Return the device names this plugin provides; they are listed when a name is unknown."""


@hookspec(firstresult=True)
def pytest_msprobe_device_call(item_name: str, api: str, phase: str, device: Any, call: DeviceCall) -> Any:
    """Run exactly one device call: the API on the device under test, and its synchronisation.

    :param item_name: the dump entry, e.g. ``Functional.softmax.1.forward``
    :param api: the API, e.g. ``Functional.softmax`` (the key of `--msprobe-kernels`)
    :param phase: ``forward`` (the API call) or ``backward`` (its autograd backward)
    :param device: the `execution.Device` (``device.name`` is the torch device, ``device.backend``
        the backend)
    :param call: a `backends.DeviceCall`; calling it runs the call once inside the backend's own
        `boundary()` and returns the outputs (also kept in ``call.result``); ``call.impl`` names the
        implementation (``my_kernels:softmax (substituted)``)

    The built-in implementation (``trylast``) runs `call()`. Implement it as a wrapper to do
    something around exactly the device call; nothing of the bench runs inside it:

    .. code-block:: python

        @pytest.hookimpl(wrapper=True)
        def pytest_msprobe_device_call(api, call):
            with my_profiler(api):
                return (yield)
    """
