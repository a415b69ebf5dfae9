"""Device backends: where the device side of every item runs, and the boundary around that call.

A backend says how to move tensors to its device, how to run an API there, how to synchronise,
and its name for `--msprobe-device`. Backends come from the hook `pytest_msprobe_device`
(`hookspecs.py`): conftest.py files and plugins first, then the entry points of the group
`pytest_msprobe.devices`, then the built-in `npu`, `cuda` and `cpu`, which use the same hook.

The device call of an item — and nothing else — runs inside `device_call`: the hook
`pytest_msprobe_device_call` (plugins wrap it) around the backend's own `boundary()` around the
API call and its synchronisation. Input generation, the bench, the reference runs and the
metrics run outside, so an instrumented or faulty backend cannot disturb the reference side.

Torch-free at import: torch is imported by the methods that need it, at run time.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import pytest

if TYPE_CHECKING:
    from .execution import Device

ENTRY_POINT_GROUP = "pytest_msprobe.devices"
AUTO = "auto"
BUILTIN = ("npu", "cuda", "cpu")  # also the order in which `auto` tries them


class BackendError(Exception):
    """A backend that cannot be loaded or is not a Backend; the message says which and why."""


class Backend:
    """A device under test. Subclass it and override what differs from a plain torch device.

    `name` is what `--msprobe-device` selects; `kind` is the torch device type of its tensors
    (`cuda`, `npu`, `privateuseone`, ...; also the autocast device type). Creating a backend must
    not import torch (it also happens when pytest configures); the methods run only when items run.
    """

    name: str = ""
    kind: str = "cpu"

    def unavailable(self) -> str | None:
        """Why this device cannot be used in this process (every item skips with it); None if usable."""
        return None

    def index(self, requested: int | None) -> int | None:
        """The device index items use; `requested` comes from --msprobe-devices (None: not pinned)."""
        return requested

    def to_device(self, tensor: Any, device: str, dtype: Any) -> Any:
        """A fresh copy of a CPU tensor on `device` (the torch device string) in `dtype`."""
        return tensor.to(device=device, dtype=dtype, copy=True)

    def run(self, api: str, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
        """Run one API call; `api` is e.g. `Functional.softmax`, `fn` the implementation to run."""
        return fn(*args, **kwargs)

    def synchronize(self, device: str) -> None:
        """Wait for the device's queued work (called inside the boundary, after each device call)."""

    def boundary(self, api: str, phase: str) -> contextlib.AbstractContextManager[Any]:
        """A context around exactly the device call (`phase` is `forward` or `backward`)."""
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} kind={self.kind!r}>"


class CpuBackend(Backend):
    name = kind = "cpu"

    def index(self, requested: int | None) -> int | None:
        return None


class CudaBackend(Backend):
    name = kind = "cuda"

    def unavailable(self) -> str | None:
        import torch

        return None if torch.cuda.is_available() else "torch.cuda.is_available() is False on this machine"

    def index(self, requested: int | None) -> int | None:
        return requested or 0

    def synchronize(self, device: str) -> None:
        import torch

        torch.cuda.synchronize()


class NpuBackend(Backend):
    name = kind = "npu"
    runtime: Any = None  # npu_runtime.NpuRuntime: --msprobe-jit-compile / --msprobe-allow-internal-format

    def unavailable(self) -> str | None:
        from .execution import npu_import_error

        error = npu_import_error()
        if error is not None:
            return f"torch_npu cannot be imported ({error})"
        if self.runtime is not None:
            from .npu_runtime import apply

            return apply(self.runtime)  # once per process, before the first item runs
        return None

    def index(self, requested: int | None) -> int | None:
        return requested or 0

    def synchronize(self, device: str) -> None:
        import torch

        torch.npu.synchronize()  # type: ignore[attr-defined]


BUILTIN_BACKENDS: dict[str, type[Backend]] = {"npu": NpuBackend, "cuda": CudaBackend, "cpu": CpuBackend}


# ----------------------------------------------------------------------------- entry points


def _entry_points() -> list[Any]:
    """The installed entry points of the group (a function, so tests can replace it)."""
    from importlib import metadata

    try:
        return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except TypeError:  # Python 3.9: a dict of groups
        return list(metadata.entry_points().get(ENTRY_POINT_GROUP, []))  # type: ignore[attr-defined, unused-ignore]  # 3.9 only


def entry_point_names(entry_points: Iterable[Any] | None = None) -> list[str]:
    """Device names from the entry points, without importing anything."""
    return [ep.name for ep in (_entry_points() if entry_points is None else entry_points)]


def load_entry_point(ep: Any) -> Backend:
    """Load one entry point: a Backend subclass, a Backend instance, or a callable returning one.

    The entry point's name is the device name (it replaces the backend's own `name`).
    """
    where = f"entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP})"
    try:
        obj = ep.load()
    except Exception as exc:
        raise BackendError(f"{where}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
    backend = obj
    if not isinstance(obj, Backend) and callable(obj):
        try:
            backend = obj()
        except Exception as exc:
            raise BackendError(f"{where}: calling it raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(backend, Backend):
        raise BackendError(f"{where}: gave {type(backend).__name__} {backend!r}, expected a "
                           "pytest_msprobe.backends.Backend (a subclass, an instance or a factory)")
    backend.name = ep.name
    return backend


def builtin_backend(name: str, entry_points: Iterable[Any] | None = None) -> Backend | None:
    """What the built-in hook implementation returns: an entry point of that name, else npu/cuda/cpu."""
    for ep in _entry_points() if entry_points is None else entry_points:
        if ep.name == name:
            return load_entry_point(ep)
    cls = BUILTIN_BACKENDS.get(name)
    return cls() if cls is not None else None


# ----------------------------------------------------------------------------- per-config state


@dataclass
class _State:
    config: pytest.Config | None
    cache: dict[str, Backend] = field(default_factory=dict)


# A stack, because pytester runs a pytest session inside a pytest session.
_STATES: list[_State] = []
_NO_CONFIG = _State(None)  # checks run outside pytest (benchmarks, scripts): built-ins and entry points


def _current() -> _State:
    return _STATES[-1] if _STATES else _NO_CONFIG


class BuiltinDevices:
    """The built-in hook implementations, registered once per config (`activate`)."""

    def __init__(self, state: _State) -> None:
        self.state = state

    @pytest.hookimpl(trylast=True)
    def pytest_msprobe_device(self, config: pytest.Config, name: str) -> Backend | None:
        backend = builtin_backend(name)
        if isinstance(backend, NpuBackend):
            from .npu_runtime import RUNTIME_KEY

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
        _STATES[:] = [state for state in _STATES if state is not self.state]


_PLUGIN_NAME = "msprobe-builtin-devices"


def activate(config: pytest.Config) -> None:
    """Register the built-in devices for this config (idempotent); from then on lookups use its hooks."""
    if config.pluginmanager.has_plugin(_PLUGIN_NAME):
        return
    state = _State(config)
    _STATES.append(state)
    config.pluginmanager.register(BuiltinDevices(state), _PLUGIN_NAME)


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
                _checked(backend, name)
                return name
        except BackendError as exc:
            raise pytest.UsageError(f"{where} {name}: {exc}") from None
    shown = [n for n in known if allow_auto or n != AUTO]
    raise pytest.UsageError(
        f"{where}: unknown device {name!r}; known devices: {', '.join(shown)} (a plugin or conftest.py adds one "
        f"with the hook pytest_msprobe_device, a package with an entry point in the group {ENTRY_POINT_GROUP!r})")


def _checked(backend: Any, name: str) -> Backend:
    if not isinstance(backend, Backend):
        raise BackendError(f"pytest_msprobe_device(name={name!r}) returned {type(backend).__name__} {backend!r}, "
                           "expected a pytest_msprobe.backends.Backend")
    return backend


def lookup(name: str) -> Backend | None:
    """The backend for a device name in this process (cached per config)."""
    state = _current()
    if name not in state.cache:
        config = state.config
        backend = config.hook.pytest_msprobe_device(config=config, name=name) if config is not None \
            else builtin_backend(name)
        if backend is None:
            return None
        state.cache[name] = _checked(backend, name)
    return state.cache[name]


def select(requested: str, index: int | None = None) -> Device:
    """The device items run on. `auto`: the first usable of npu, cuda, cpu (as their backends say)."""
    from .execution import Device, NotCheckable

    try:
        if requested == AUTO:
            for candidate in BUILTIN:
                backend = lookup(candidate)
                if backend is not None and backend.unavailable() is None:
                    return Device(backend.kind, backend.index(index), backend)
            raise NotCheckable("--msprobe-device auto: none of npu, cuda, cpu is usable")
        backend = lookup(requested)
    except BackendError as exc:
        raise NotCheckable(f"--msprobe-device {requested}: {exc}") from None
    if backend is None:
        raise NotCheckable(f"unknown --msprobe-device {requested!r}")
    reason = backend.unavailable()
    if reason:
        raise NotCheckable(f"--msprobe-device {requested}: {reason}")
    return Device(backend.kind, backend.index(index), backend)


# ----------------------------------------------------------------------------- the boundary


class DeviceCall:
    """Exactly one device call of one item; what `pytest_msprobe_device_call` implementations wrap."""

    def __init__(self, item_name: str, api: str, phase: str, device: Device, impl: str,
                 fn: Callable[[], Any]) -> None:
        self.item_name, self.api, self.phase, self.device, self.impl = item_name, api, phase, device, impl
        self._fn = fn
        self.done = False
        self.result: Any = None

    def __call__(self) -> Any:
        """Run the call once, inside the backend's boundary, and synchronise the device."""
        if self.done:
            raise RuntimeError(f"the device call of {self.item_name} ({self.phase}) already ran")
        self.done = True
        backend = self.device.backend
        with backend.boundary(self.api, self.phase) if backend is not None else contextlib.nullcontext():
            self.result = self._fn()
            self.device.synchronize()
        return self.result

    def __repr__(self) -> str:
        return f"<DeviceCall {self.item_name} {self.phase} on {self.device.name}: {self.impl}>"


def device_call(item_name: str, api: str, phase: str, device: Device, impl: str, fn: Callable[[], Any]) -> Any:
    """Run `fn` (the device side of one item) as the device call: hook wrappers, boundary, sync."""
    call = DeviceCall(item_name, api, phase, device, impl, fn)
    config = _current().config
    if config is None:
        return call()
    config.hook.pytest_msprobe_device_call(item_name=item_name, api=api, phase=phase, device=device, call=call)
    if not call.done:
        raise RuntimeError(f"a pytest_msprobe_device_call implementation returned without running the device call "
                           f"of {item_name}")
    return call.result


def runner(device: Device, api: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as the device's backend runs it."""
    backend = device.backend
    if backend is None or type(backend).run is Backend.run:
        return fn

    def run(*args: Any, **kwargs: Any) -> Any:
        return backend.run(api, fn, args, kwargs)

    return run


__all__ = [
    "AUTO", "BUILTIN", "Backend", "BackendError", "CpuBackend", "CudaBackend", "DeviceCall", "ENTRY_POINT_GROUP",
    "NpuBackend", "activate", "builtin_backend", "check_name", "device_call", "entry_point_names", "known_names",
    "load_entry_point", "lookup", "runner", "select",
]
