"""`apis=`: which calls are checked, read as msprobe's dump config reads its `list` at level L1.

An entry is a full call name (`Functional.linear.0`, with or without `.forward`): that call only; or a part
of an API name (`linear`, `Functional.softmax`, `mm`): every call of the APIs whose name contains it, as
msprobe matches `list` entries that are not full names. No entries: every call.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

_FULL = re.compile(r"^[A-Za-z]+\..+\.\d+(\.forward)?$")


class Selection:
    def __init__(self, entries: Sequence[str] | None) -> None:
        if isinstance(entries, str):
            entries = [entries]
        entries = list(entries or [])
        bad = [e for e in entries if not isinstance(e, str) or not e.strip()]
        if bad:
            raise ValueError(f"checking(): apis={bad!r}: each entry is an API name or a part of one")
        self.calls = {e.removesuffix(".forward") for e in entries if _FULL.match(e)}
        self.parts = [e for e in entries if not _FULL.match(e)]
        self.every = not entries

    def wants_api(self, api: str) -> bool:
        """Whether any call of this API (`Functional.linear`) may be checked: decided before it is copied."""
        return self.every or any(part in api for part in self.parts) or \
            any(call.rsplit(".", 1)[0] == api for call in self.calls)

    def wants_call(self, name: str) -> bool:
        """Whether this numbered call (`Functional.linear.3`) is checked."""
        return self.every or name in self.calls or any(part in name.rsplit(".", 1)[0] for part in self.parts)
