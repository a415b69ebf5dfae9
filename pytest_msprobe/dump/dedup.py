"""`msprobe_filter_api`: check one of each group of identical calls, report the others with its result.

A training step repeats the same API with the same shapes and statistics in every layer. msprobe's
`-f/--filter_api` drops the repeats; here every call keeps its item, and a repeat reports the result
of the first call of its group (dump order), marked as reused in the terminal (`-v`), the CSV
message and the JSON record (`reused_from`).

Two forward calls are identical when they are the same API (`Type.name`) and their recorded
arguments are equal except for the Max/Min statistics of the positional arguments: msprobe's rule,
so Mean, Norm, shapes, dtypes, `requires_grad`, saved-tensor file names and keyword arguments must
match, which in practice only happens for calls on identical data. Unlike msprobe, positional list
arguments (the tensors of `torch.cat`) are compared as well (msprobe leaves them out, so two `cat`
calls of different tensors would count as identical there). A backward item is reused only when its
forward call is identical and the recorded gradients (the backward entry's `input`) are equal by the
same rule; msprobe skips the backward of every dropped call instead.

Which item runs the check does not depend on scheduling: a repeat whose representative has not run
in this process checks the representative's entry itself (once per process; the plugin's xdist
scheduler keeps a group on one worker). Torch-free.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from ..records.record import Record
from .reader import Dump, parse_entry_name

_STATS = ("Max", "Min")


def _without_stats(value: Any) -> Any:
    """An argument encoding without Max/Min at any depth."""
    if isinstance(value, list):
        return [_without_stats(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_stats(v) for k, v in value.items() if k not in _STATS}
    return value


def call_key(dump: Dump, entry_name: str) -> str | None:
    """The group key of an item (None: not groupable, the item runs as usual)."""
    try:
        name = parse_entry_name(entry_name)
    except ValueError:
        return None
    forward = dump.entry(f"{name.full_name}.forward")
    if not isinstance(forward, dict):
        return None
    parts: list[Any] = [name.api_type, name.api_name, name.direction,
                        _without_stats(forward.get("input_args")), forward.get("input_kwargs")]
    if name.direction == "backward":
        backward = dump.entry(entry_name)
        if not isinstance(backward, dict):
            return None
        parts.append(_without_stats(backward.get("input")))
    try:
        text = json.dumps(parts, sort_keys=True, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def groups(dump: Dump, names: list[str]) -> dict[str, tuple[str, str]]:
    """{entry name: (key, representative entry name)} for every name in a group of two or more;
    the representative is the group's first name in dump order."""
    first: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for entry_name in names:
        key = call_key(dump, entry_name)
        if key is None:
            continue
        members.setdefault(key, []).append(entry_name)
        first.setdefault(key, entry_name)
    return {n: (key, first[key]) for key, group in members.items() if len(group) > 1 for n in group}


def reused_record(record: Record, representative: str, own_name: str) -> Record:
    """A copy of the representative's check result for a repeat: its own API name in every row, the
    provenance in `reused_from` and in every message, no timings (nothing ran)."""
    rep, own = parse_entry_name(representative).full_name, parse_entry_name(own_name).full_name
    note = f"reused: identical to {representative} (msprobe_filter_api)"
    copy = record.copy()
    copy.api, copy.reused_from, copy.timings, copy.notes = own, representative, {}, [note, *record.notes]
    copy.message = f"{note}; {record.message}" if record.message else note
    for row in copy.outputs:
        if row.name.startswith(f"{rep}."):
            row.name = own + row.name[len(rep):]
        row.message = f"[{note}] {row.message}" if row.message else f"[{note}]"
    return copy
