"""Device backends: where the device side of every item runs, and the boundary around that call.

A backend says how to move tensors to its device, how to run an API there, how to synchronise,
and its name for `--msprobe-device`. Backends come from the hook `pytest_msprobe_device`
(`hookspecs.py`): conftest.py files and plugins first, then the entry points of the group
`pytest_msprobe.devices`, then the built-in `npu`, `cuda` and `cpu`, which use the same hook.

The device call of an item — and nothing else — runs inside `device_call`: the hook
`pytest_msprobe_device_call` (plugins wrap it) around the backend's own `boundary()` around the
API call and its synchronisation. Input generation, the bench, the reference runs and the
metrics run outside, so an instrumented or faulty backend cannot disturb the reference side.

Torch-free and pytest-free at import: torch is imported by the methods that need it, at run time;
the hooks reach this module as two callables of a `Session` (session/device_hooks.py).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

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

    def reads_tf32(self, family: str) -> bool:
        """Whether this device reads only TF32 (10 mantissa bits) of fp32 inputs of `family`: "conv"
        or "matmul" (the API lists are in api_specs precision.tf32)."""
        return False

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

    def reads_tf32(self, family: str) -> bool:
        """torch's settings as the user's code left them: the per-backend `fp32_precision` ("tf32" or
        "ieee"; "none" defers to the level above), else the older `allow_tf32` flags (cuDNN's is on by
        default, cuBLAS's is off unless torch.set_float32_matmul_precision("high") or lower)."""
        import torch

        levels = ("cudnn.conv", "cudnn", "") if family == "conv" else ("cuda.matmul", "cuda", "")
        for level in levels:
            try:
                node: Any = torch.backends
                for part in filter(None, level.split(".")):
                    node = getattr(node, part)
                value = node.fp32_precision
            except (AttributeError, RuntimeError):
                break  # an older torch: only the flags below
            if value in ("tf32", "ieee"):
                return bool(value == "tf32")
        try:
            flag = torch.backends.cudnn.allow_tf32 if family == "conv" else torch.backends.cuda.matmul.allow_tf32
        except RuntimeError:  # torch refuses to read the old flag after the new API was used: its default
            return family == "conv"
        return bool(flag)


class NpuBackend(Backend):
    name = kind = "npu"
    runtime: Any = None  # npu_runtime.NpuRuntime: msprobe_jit_compile / msprobe_allow_internal_format

    def unavailable(self) -> str | None:
        from ..npu_import import npu_import_error

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


# ----------------------------------------------------------------------------- per-session state


@dataclass
class Session:
    """Where backends come from in one pytest session, handed in by the pytest layer
    (session/device_hooks.py): `provider(name)` answers the hook pytest_msprobe_device, and
    `call_hook(call)` runs the hook pytest_msprobe_device_call around one device call."""

    provider: Callable[[str], Any]
    call_hook: Callable[[DeviceCall], None]
    cache: dict[str, Backend] = field(default_factory=dict)


# A stack, because pytester runs a pytest session inside a pytest session. Empty: checks run outside
# pytest (benchmarks, scripts) and see the built-ins and entry points only.
_SESSIONS: list[Session] = []
_NO_SESSION_CACHE: dict[str, Backend] = {}


def open_session(session: Session) -> None:
    _SESSIONS.append(session)


def close_session(session: Session) -> None:
    _SESSIONS[:] = [s for s in _SESSIONS if s is not session]


def checked_backend(backend: Any, name: str) -> Backend:
    """A device hook's answer, refused unless it is a Backend (as lookup and the ini's device names check it)."""
    if not isinstance(backend, Backend):
        raise BackendError(f"pytest_msprobe_device(name={name!r}) returned {type(backend).__name__} {backend!r}, "
                           "expected a pytest_msprobe.backends.Backend")
    return backend


def lookup(name: str) -> Backend | None:
    """The backend for a device name in this process (cached per session)."""
    session = _SESSIONS[-1] if _SESSIONS else None
    cache = session.cache if session is not None else _NO_SESSION_CACHE
    if name not in cache:
        backend = session.provider(name) if session is not None else builtin_backend(name)
        if backend is None:
            return None
        cache[name] = checked_backend(backend, name)
    return cache[name]


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


def make_current(requested: str, index: int | None) -> None:
    """Make the items' device torch's current one (cuda/npu), once per process that runs items, so that
    tensors made without an index land on it; an unusable device is left to the items to report."""
    from .execution import NotCheckable

    try:
        device = select(requested, index)
    except NotCheckable:
        return
    if device.kind in ("cuda", "npu"):
        import torch

        getattr(torch, device.kind).set_device(device.index or 0)


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
    if not _SESSIONS:
        return call()
    _SESSIONS[-1].call_hook(call)
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
    "NpuBackend", "Session", "builtin_backend", "checked_backend", "close_session", "device_call", "entry_point_names",
    "load_entry_point", "lookup", "open_session", "runner", "select",
]


NOT_IMPLEMENTED_MARKS = ("not implemented for", "not currently implemented", "could not run '")


def not_implemented(exc: BaseException | None) -> bool:
    """Whether an exception says the backend has no kernel for the call (torch's dispatcher: `"foo_cuda" not
    implemented for 'BFloat16'`, `Could not run 'aten::foo' with arguments from the 'CUDA' backend`), as
    opposed to a kernel that ran and failed."""
    if isinstance(exc, NotImplementedError):
        return True
    text = str(exc).lower() if isinstance(exc, (RuntimeError, TypeError)) else ""
    return any(mark in text for mark in NOT_IMPLEMENTED_MARKS)
