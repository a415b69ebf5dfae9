"""The pytest side of `--msprobe-kernels`: validation when pytest configures, deselection of the APIs
without a kernel, and the header and summary lines. The kernels themselves: runs/kernels.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from ..runs.kernels import KernelSpecError, KernelTable, api_key, normalize, preload
from . import ini_keys
from .items import ApiItem


class KernelSelection:
    """Deselects the items of APIs without a kernel, and says so in the header and summary."""

    def __init__(self, table: KernelTable, run_all: bool) -> None:
        self.table, self.run_all = table, run_all
        self.deselected: int | None = None

    def pytest_report_header(self, config: pytest.Config) -> str:
        names = self.table.names
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} APIs)" if len(names) > 6 else "")
        others = "run with the usual APIs (msprobe_kernels_run_all)" if self.run_all else "deselected"
        return f"msprobe kernels: {self.table.spec} substitutes {shown}; other APIs {others}"

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if self.run_all:
            return
        from .fuzz import FuzzItem

        keep, drop = [], []
        for item in items:  # an API without a kernel: its item and its [fuzz] item (--msprobe-fuzz)
            name = item.name if isinstance(item, ApiItem) else getattr(item, "target", None) \
                if isinstance(item, FuzzItem) else None
            if name is not None and api_key(name) not in self.table.mapping:
                drop.append(item)
            else:
                keep.append(item)
        self.deselected = len(drop)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def _line(self) -> str | None:
        if not self.deselected:
            return None
        return f"msprobe: {self.deselected} deselected: no kernel (-o msprobe_kernels_run_all=true runs them as usual)"

    def pytest_report_collectionfinish(self, config: pytest.Config) -> str | None:
        return self._line()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        line = self._line()
        if line:
            terminalreporter.write_line(line)


def configure(config: pytest.Config) -> str | None:
    """Validate --msprobe-kernels / ini msprobe_kernels; returns the spec the items use (or None)."""
    existing = config.pluginmanager.get_plugin("msprobe-kernels")
    if existing is not None:
        return cast(KernelSelection, existing).table.spec
    value = config.getoption("msprobe_kernels", None)
    where, base = "--msprobe-kernels", config.invocation_params.dir
    if not value:
        value = config.getini("msprobe_kernels")
        where = "ini msprobe_kernels"
        base = config.inipath.parent if config.inipath else config.rootpath
    if not value:
        if ini_keys.value(config, "msprobe_kernels_run_all"):
            raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_kernels_run_all')} needs --msprobe-kernels")
        return None
    try:
        spec = normalize(str(value), Path(base), where)
        loaded = preload(spec, where)
    except KernelSpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(KernelSelection(loaded, ini_keys.value(config, "msprobe_kernels_run_all")),
                                  "msprobe-kernels")
    return spec


__all__ = ["KernelSelection", "configure"]
