"""The dump.json collector: one ApiItem per forward and backward entry, their markers, early -k/-m
selection for large dumps, and the `[fuzz]` items of --msprobe-fuzz right after their API.

Collection only parses JSON (no torch), so every xdist worker collects quickly.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Callable

import pytest

from ..dump.reader import KNOWN_TYPES, Dump, DumpError, load_dump, parse_entry_name
from .fuzz import extra_items
from .items import KNOWN_DTYPES, ApiItem, _mark, _selection, _want_dtype_markers, entry_markers
from .stash import SETTINGS_KEY


class DumpFile(pytest.File):
    """A dump.json: one item per forward entry and one per backward entry."""

    def collect(self) -> Iterator[pytest.Item]:
        try:
            dump = load_dump(self.path)
        except DumpError as exc:
            raise self.CollectError(str(exc)) from None
        config = self.config
        registered = set(KNOWN_TYPES + KNOWN_DTYPES)
        with_dtypes = _want_dtype_markers(config)
        fuzz_items: Callable[[pytest.Collector, pytest.Item], Iterator[pytest.Item]] | None = None
        if config.getoption("msprobe_fuzz", 0):
            fuzz_items = extra_items
        grouping: dict[str, tuple[str, str]] = {}
        if config.stash[SETTINGS_KEY].filter_api:
            from ..dump.dedup import groups

            grouping = groups(dump, dump.entry_names())
        # Large dumps only: items -k/-m drop are then never made, so pytest's summary does not count them as
        # deselected; small dumps keep pytest's own accounting.
        large = len(dump.entry_names()) >= int(config.getini("msprobe_early_selection_entries"))
        selected = None if fuzz_items is not None or not large else _selection(self)
        msprobe = _mark("msprobe")
        for order, entry_name in enumerate(dump.entry_names()):
            try:
                parsed = parse_entry_name(entry_name)
            except ValueError:
                parsed = None
            markers = [] if parsed is None else entry_markers(dump, entry_name, parsed, with_dtypes)
            for marker in markers:
                if marker not in registered:
                    config.addinivalue_line("markers", f"{marker}: msprobe API type or dtype")
                    registered.add(marker)
            if selected is not None and not selected(entry_name, ["msprobe", *markers]):
                continue  # -k/-m would deselect it: not even made (a 200k-entry dump, 20 items picked)
            item = ApiItem.from_parent(self, name=entry_name, order=order)
            item.reuse = grouping.get(entry_name)
            # Marks are attached directly (add_marker costs ~50 us per call, 400k calls for a big dump);
            # -m and -k both read own_markers.
            item.own_markers += [msprobe, *(_mark(m) for m in markers)]
            yield item
            if fuzz_items is not None:
                yield from fuzz_items(self, item)  # --msprobe-fuzz: <entry>[fuzz] right after its API

    @property
    def dump(self) -> Dump:
        return load_dump(self.path)
