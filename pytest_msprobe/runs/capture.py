"""A seam through which one item's check hands its tensors to the failure tools.

`check._run` calls :func:`stash` at a few points (final inputs, raw outputs, compared pairs). It is a
no-op unless a caller opened :func:`capturing` around the check, which is what `--msprobe-save-error-data`,
`--msprobe-repro`, `--msprobe-html` and `--msprobe-fuzz` do. Only references are kept (no copies), and
only for the duration of one item. Torch-free.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

_CURRENT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("msprobe_capture", default=None)


def stash(**values: Any) -> None:
    """Record values of the running check when someone is capturing; otherwise do nothing."""
    target = _CURRENT.get()
    if target is not None:
        target.update(values)


def active() -> bool:
    return _CURRENT.get() is not None


@contextlib.contextmanager
def capturing() -> Iterator[dict[str, Any]]:
    """Collect what the check stashes while the block runs (nested blocks get their own dict)."""
    captured: dict[str, Any] = {}
    token = _CURRENT.set(captured)
    try:
        yield captured
    finally:
        _CURRENT.reset(token)
