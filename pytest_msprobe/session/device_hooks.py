"""The pytest side of the device backends: the built-in devices as implementations of the hooks,
and name validation when pytest configures.

`activate(config)` hands runs/backends.py a `Session` whose two callables call the hooks
pytest_msprobe_device and pytest_msprobe_device_call, so the runs stage reaches plugins' devices and
device-call wrappers without importing pytest.
"""
from __future__ import annotations

import pytest

from ..runs.backends import (
    AUTO,
    BUILTIN,
    ENTRY_POINT_GROUP,
    Backend,
    BackendError,
    DeviceCall,
    NpuBackend,
    Session,
    builtin_backend,
    checked_backend,
    close_session,
    entry_point_names,
    open_session,
)
from .npu_options import RUNTIME_KEY


class BuiltinDevices:
    """The built-in hook implementations, registered once per config (`activate`)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @pytest.hookimpl(trylast=True)
    def pytest_msprobe_device(self, config: pytest.Config, name: str) -> Backend | None:
        backend = builtin_backend(name)
        if isinstance(backend, NpuBackend):
            backend.runtime = config.stash.get(RUNTIME_KEY, None)
        return backend

    @pytest.hookimpl(trylast=True)
    def pytest_msprobe_device_names(self, config: pytest.Config) -> list[str]:
        return [*BUILTIN, *entry_point_names()]

    @pytest.hookimpl(trylast=True)
    def pytest_msprobe_device_call(self, call: DeviceCall) -> DeviceCall:
        if not call.done:
            call()
        return call

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        close_session(self.session)


_PLUGIN_NAME = "msprobe-builtin-devices"


def activate(config: pytest.Config) -> None:
    """Register the built-in devices for this config (idempotent); from then on lookups use its hooks."""
    if config.pluginmanager.has_plugin(_PLUGIN_NAME):
        return

    def call_hook(call: DeviceCall) -> None:
        config.hook.pytest_msprobe_device_call(item_name=call.item_name, api=call.api, phase=call.phase,
                                               device=call.device, call=call)

    session = Session(provider=lambda name: config.hook.pytest_msprobe_device(config=config, name=name),
                      call_hook=call_hook)
    open_session(session)
    config.pluginmanager.register(BuiltinDevices(session), _PLUGIN_NAME)


def known_names(config: pytest.Config) -> list[str]:
    activate(config)
    names: dict[str, None] = {AUTO: None}
    for result in config.hook.pytest_msprobe_device_names(config=config):
        for name in result or ():
            names[str(name)] = None
    return list(names)


def check_name(config: pytest.Config, name: str, where: str, *, allow_auto: bool = True) -> str:
    """Validate a device name when pytest configures; a clear usage error lists the known devices."""
    activate(config)
    if name in BUILTIN or (name == AUTO and allow_auto):
        return name
    known = known_names(config)
    if name == AUTO:
        if allow_auto:
            return name
    elif name in known:
        return name
    else:
        try:  # a plugin may answer for names it does not list
            backend = config.hook.pytest_msprobe_device(config=config, name=name)
            if backend is not None:
                checked_backend(backend, name)
                return name
        except BackendError as exc:
            raise pytest.UsageError(f"{where} {name}: {exc}") from None
    shown = [n for n in known if allow_auto or n != AUTO]
    raise pytest.UsageError(
        f"{where}: unknown device {name!r}; known devices: {', '.join(shown)} (a plugin or conftest.py adds one "
        f"with the hook pytest_msprobe_device, a package with an entry point in the group {ENTRY_POINT_GROUP!r})")


BENCH_DEVICES = ("cpu", "cuda", "npu")


def bench_device_of(name: str, where: str) -> str:
    """msprobe_bench_device as a torch device (`cpu`, `cuda:N`, `npu:N`), usable on this machine: a bad or
    unusable one is one usage error line. torch is imported only to ask an accelerator."""
    kind, _, index = name.strip().partition(":")
    if kind not in BENCH_DEVICES or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise pytest.UsageError(f"{where}: {name!r} is not a bench device (cpu, cuda, cuda:N, npu, npu:N)")
    if kind == "cpu":
        return kind
    from ..runs.backends import builtin_backend

    backend = builtin_backend(kind)
    reason = "no backend" if backend is None else backend.unavailable()
    if reason:
        raise pytest.UsageError(f"{where} {name}: {reason}")
    return f"{kind}:{index or 0}"


__all__ = ["BENCH_DEVICES", "BuiltinDevices", "activate", "bench_device_of", "check_name", "known_names"]
