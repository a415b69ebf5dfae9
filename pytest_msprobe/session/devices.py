"""Pinning xdist workers to devices from a pool the controller manages (torch-free at import).

The controller owns a pool of (device, k) slots, at most `per_device` per device, and hands one to
each worker in `pytest_configure_node` through `workerinput`. A crashed worker's slot is released
in `pytest_testnodedown`, which xdist calls before it starts the replacement, and the replacement
takes that slot back: xdist gives it a new `gwN` name, so nothing here is derived from names.

The worker applies its slot in its own `pytest_configure`, before torch touches the device: it
narrows ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES to the one device (indexing into the
variable when the caller already set it) and runs on local index 0. If something imported torch
earlier (a conftest), the variables may no longer take effect, so the worker keeps the full view
and selects the device by index instead. Either way the first item calls torch.npu/cuda.set_device.

Every process that runs items uses the same number of torch threads (`threads`), whatever -n is.
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import pytest

from ..settings import CheckOptions, Settings
from . import ini_keys
from .items import ApiItem

VISIBLE_VARS = ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
WORKERINPUT_KEY = "msprobe_device"


@dataclass(frozen=True)
class Slot:
    device: int  # device id as given to --msprobe-devices
    k: int       # position among that device's workers

    def __str__(self) -> str:
        return f"device {self.device} slot {self.k}"


class DevicePool:
    """Slots per device; a new worker goes to the least used device, a replacement to the slot just freed."""

    def __init__(self, devices: list[int], per_device: int) -> None:
        if not devices:
            raise ValueError("no devices")
        if per_device < 1:
            raise ValueError("workers per device must be at least 1")
        self.devices = list(devices)
        self.per_device = per_device
        self.held: dict[str, Slot] = {}   # worker id -> slot
        self.freed: list[Slot] = []       # released slots, the most recent last
        self.history: list[tuple[str, Slot]] = []

    @property
    def capacity(self) -> int:
        return len(self.devices) * self.per_device

    def acquire(self, worker: str) -> Slot:
        taken = set(self.held.values())
        while self.freed:
            slot = self.freed.pop()
            if slot not in taken:
                return self._give(worker, slot)
        load = {d: 0 for d in self.devices}
        for slot in taken:
            load[slot.device] += 1
        device = min(self.devices, key=lambda d: (load[d], self.devices.index(d)))
        if load[device] >= self.per_device:
            raise RuntimeError(f"all {self.capacity} device slots are in use "
                               f"({len(self.devices)} devices x {self.per_device} workers)")
        k = min(set(range(self.per_device)) - {s.k for s in taken if s.device == device})
        return self._give(worker, Slot(device, k))

    def release(self, worker: str) -> Slot | None:
        slot = self.held.pop(worker, None)
        if slot is not None:
            self.freed.append(slot)
        return slot

    def _give(self, worker: str, slot: Slot) -> Slot:
        self.held[worker] = slot
        self.history.append((worker, slot))
        return slot


def parse_devices(values: list[str]) -> list[int]:
    """`0 1 2`, `0,1,2` or a mix; ids are what the caller's device view shows (like msprobe's -d)."""
    ids: list[int] = []
    for value in values:
        for part in str(value).replace(",", " ").split():
            if not part.isdigit():
                raise pytest.UsageError(f"--msprobe-devices: {part!r} is not a device id (0, 1, ...)")
            if int(part) in ids:
                raise pytest.UsageError(f"--msprobe-devices: device {part} is listed twice")
            ids.append(int(part))
    return ids


def _shown(environ: Mapping[str, str], var: str) -> list[str] | None:
    """The ids a *_VISIBLE_DEVICES variable lists; None when unset. Empty (devices hidden) is left alone."""
    value = environ.get(var)
    return None if value is None or not value.strip() else [p.strip() for p in value.split(",")]


def check_visible(devices: list[int], environ: Mapping[str, str] = os.environ) -> None:
    """A device id must exist in every *_VISIBLE_DEVICES list the caller already set."""
    for var in VISIBLE_VARS:
        shown = _shown(environ, var)
        if shown is not None and any(d >= len(shown) for d in devices):
            raise pytest.UsageError(f"--msprobe-devices {' '.join(map(str, devices))}: {var}={environ[var]!r} "
                                    f"shows only {len(shown)} device(s)")


def cap_workers(config: pytest.Config, capacity: int) -> str | None:
    """Trim xdist's worker list (also after `-n auto`) to the pool's capacity; returns the note."""
    tx = getattr(config.option, "tx", None) or []
    if len(tx) <= capacity:
        return None
    config.option.tx = tx[:capacity]
    config.option.numprocesses = capacity
    return f"{len(tx)} workers asked for, {capacity} started (msprobe_workers_per_device)"


_BEFORE_PIN: dict[str, str | None] = {}  # this process's visible-device variables before it pinned itself


def pin(slot: Slot, environ: MutableMapping[str, str] = os.environ) -> int:
    """Apply a slot in this process; returns the device index the items use."""
    if "torch" in sys.modules:  # the device view may already be fixed; select by index instead
        return slot.device
    if environ is os.environ:
        for var in VISIBLE_VARS:
            _BEFORE_PIN.setdefault(var, environ.get(var))
    narrow(slot, environ)
    return 0


def narrow(slot: Slot, environ: MutableMapping[str, str]) -> None:
    """The visible-device variables of a process that runs on the slot's device only (local index 0)."""
    for var in VISIBLE_VARS:
        shown = _shown(environ, var)
        if var not in environ or shown is not None:
            environ[var] = shown[slot.device] if shown else str(slot.device)


def child_slots(config: pytest.Config, count: int) -> list[tuple[dict[str, str], int | None]] | None:
    """(environment, device index) for `count` child processes that run items (the online session's
    workers), spread over --msprobe-devices in turn; None without it. Each child narrows the
    visible-device variables as this process saw them before it pinned itself."""
    info = _info(config)
    if info is None:
        return None
    before = {var: os.environ.get(var) for var in VISIBLE_VARS}
    before.update(_BEFORE_PIN)
    out: list[tuple[dict[str, str], int | None]] = []
    for k in range(count):
        environ = {var: value for var, value in before.items() if value is not None}
        narrow(Slot(info.devices[k % len(info.devices)], k // len(info.devices)), environ)
        out.append((environ, 0))
    return out


def local_slot(config: pytest.Config, devices: list[int]) -> Slot | None:
    """This process's slot: the controller's choice on a worker, the first device without xdist."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        chosen = workerinput.get(WORKERINPUT_KEY)
        return Slot(*chosen) if chosen else None
    distributed = bool(getattr(config.option, "tx", None)) or getattr(config.option, "dist", "no") != "no"
    return None if distributed or not devices else Slot(devices[0], 0)


class DeviceHooks:
    """Controller side under xdist: one pool slot per live worker."""

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool

    def pytest_configure_node(self, node: Any) -> None:
        slot = self.pool.acquire(node.gateway.id)
        node.workerinput[WORKERINPUT_KEY] = [slot.device, slot.k]

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self.pool.release(node.gateway.id)

    def summary(self) -> str:
        by_device: dict[int, list[str]] = {d: [] for d in self.pool.devices}
        for worker, slot in self.pool.history:
            by_device[slot.device].append(worker)
        return "; ".join(f"{d}: {' '.join(w) or '-'}" for d, w in by_device.items())


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """For what a process makes once and keeps, torch and the check's imports (numpy, numba,
    bench_functions, ...: about 10^6 objects) and the compiled checks' warm-up: no cyclic collection
    while they are made (each full pass costs 0.1-0.2 s: four of them at the first item), and none of them
    in any later pass (pytest collects 5x at exit)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


class FirstItem:
    """Where items run: set torch's thread count and current device once, when the first dump item
    starts (torch is imported then, never earlier; other tests of the session are left alone)."""

    def __init__(self, options: CheckOptions) -> None:
        self.options, self.done = options, False

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        if self.done or not (isinstance(item, ApiItem) or item.get_closest_marker("msprobe")):
            return  # dump items: API items and their [fuzz] items (which carry the API's markers)
        self.done = True
        with long_lived():  # a [fuzz] item alone (an API item has imported them in pytest_runtest_protocol)
            import torch

            from ..check import rerun as check  # noqa: F401
        from ..runs.backends import make_current

        torch.set_num_threads(self.options.threads)
        if self.options.device_index is not None:
            make_current(self.options.device, self.options.device_index)


@dataclass
class DeviceInfo:
    """What the header and the summary say about devices."""

    devices: list[int]
    per_device: int
    slot: Slot | None = None           # this process's slot (no xdist)
    hooks: DeviceHooks | None = None   # the pool (xdist controller)
    note: str | None = None

    def header(self) -> str:
        text = f"msprobe: devices {' '.join(map(str, self.devices))}, at most {self.per_device} workers per device"
        if self.slot is not None:
            text += f"; this process: {self.slot}"
        return text + (f"; {self.note}" if self.note else "")


DEVICES_KEY = pytest.StashKey[DeviceInfo]()


def _info(config: pytest.Config) -> DeviceInfo | None:
    """Parse the options once per process (before pinning changes the environment)."""
    if DEVICES_KEY not in config.stash:
        devices = parse_devices(config.getoption("msprobe_devices") or config.getini("msprobe_devices"))
        if not devices:
            return None
        value = ini_keys.value(config, "msprobe_workers_per_device") or ""
        if not str(value).isdigit() or int(value) < 1:
            raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_workers_per_device')}: {value!r} is not a "
                                    "positive integer")
        if not hasattr(config, "workerinput"):
            check_visible(devices)
        config.stash[DEVICES_KEY] = DeviceInfo(devices, int(value))
    return config.stash[DEVICES_KEY]


def device_index(config: pytest.Config) -> int | None:
    """Pin this process if it runs items on a pool device; the index its items use."""
    info = _info(config)
    if info is None:
        return None
    info.slot = local_slot(config, info.devices)
    return None if info.slot is None else pin(info.slot)


def work_threads(threads: int, config: pytest.Config | None = None, workers: int | None = None) -> int:
    """2 where this process has a core to spare beside its torch threads, counting every process that runs
    items (xdist workers, or `workers` online checkers), and msprobe_helper_thread allows it (the checker's
    own work then uses two threads: CheckOptions.work_threads), else 1."""
    if config is not None:
        if ini_keys.value(config, "msprobe_helper_thread") == "off":
            return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    if workers is None:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return 2 if cpus >= workers * (threads + 1) else 1


def threads(config: pytest.Config) -> int:
    """Intra-op threads for the items: msprobe_threads, else OMP_NUM_THREADS, else 1. The same in every
    process, because torch's CPU reductions (the bench) round differently with another thread count;
    1 also keeps N workers from oversubscribing the cores (-n 2 on 2 cores: 11-13 s instead of 6-7 s
    for the 1,008-item benchmark dump with two threads per worker). FirstItem
    applies it, so a pytest session without dump items keeps torch's default."""
    value = ini_keys.value(config, "msprobe_threads") or os.environ.get("OMP_NUM_THREADS") or "1"
    if not str(value).strip().isdigit() or int(value) < 1:
        raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_threads')}: {value!r} is not a positive integer")
    return int(value)


def configure(config: pytest.Config, settings: Settings) -> None:
    """Every process: threads and device at its first item. Controller under xdist: the pool."""
    config.pluginmanager.register(FirstItem(settings.check_options), "msprobe-first-item")
    info = _info(config)
    if info is None or hasattr(config, "workerinput") or not getattr(config.option, "tx", None):
        return
    pool = DevicePool(info.devices, info.per_device)
    info.hooks = DeviceHooks(pool)
    info.note = cap_workers(config, pool.capacity)
    config.pluginmanager.register(info.hooks, "msprobe-devices")
