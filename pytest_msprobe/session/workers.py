"""How many xdist workers a run is worth (`msprobe_min_work_per_worker`).

A worker costs its start-up (Python, pytest, collecting the dump, importing torch: 1.5-2 CPU seconds
here) and the controller's time per item (~1 ms); on a 1,000-call dump of tiny calls (3 s of work)
`-n 2` is slower than `-n 0`. The controller knows the work before it starts any worker: the dumps'
indexes hold a cost estimate per call (shard.work_cost). It starts at most one worker per
`msprobe_min_work_per_worker` seconds of estimated work, and none (the run stays in this process)
when that is fewer than two; the header says so. Only when every argument is a dump file and no
option picks an unknown subset (--lf, --sw, --msprobe-resume); -k/-m are applied to the entry names and
markers. Estimated seconds are element-equivalents times SECONDS_PER_UNIT, measured on the project's
2-core CPU machine (benchmarks/README.md): a faster host only makes the estimate conservative.
"""
from __future__ import annotations

import math
from typing import Callable

import pytest

from ..dump.reader import DumpError, load_dump, parse_entry_name
from . import ini_keys
from .ini_keys import DEFAULT_MIN_WORK_S
from .items import entry_markers, matcher
from .shard import work_cost

SECONDS_PER_UNIT = 25e-9
NOTE_KEY = pytest.StashKey[str]()


def min_work(config: pytest.Config) -> float:
    value = ini_keys.value(config, "msprobe_min_work_per_worker")
    if value is None:
        value = DEFAULT_MIN_WORK_S
    where = ini_keys.where(config, "msprobe_min_work_per_worker")
    try:
        seconds = float(value)
    except ValueError:
        raise pytest.UsageError(f"{where}: {value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise pytest.UsageError(f"{where}: {value!r} must be 0 or more seconds")
    return seconds


def estimate_seconds(config: pytest.Config) -> tuple[int, float] | None:
    """(items, estimated seconds) of the run, or None when the arguments are not all dumps or an option
    selects a subset the estimate cannot know."""
    option = config.option
    if getattr(option, "lf", False) or getattr(option, "stepwise", False) or getattr(option, "msprobe_resume", False):
        return None
    if getattr(option, "msprobe_fuzz", 0):
        return None
    keep = _selection(config)
    here = config.invocation_params.dir
    items, units = 0, 0.0
    for arg in dict.fromkeys(config.args):
        path = here / arg.split("::", 1)[0]
        if path.suffix != ".json" or "::" in arg or not path.is_file():
            return None
        try:
            dump = load_dump(path, ("work", "dtypes") if keep else ("work",))
        except DumpError:
            return None
        parts = [p.lower() for p in path.resolve().parts]
        for name in dump.entry_names():
            try:
                parsed = parse_entry_name(name)
            except ValueError:
                continue
            if keep is not None and not keep(name, ["msprobe", *entry_markers(dump, name, parsed, True)], parts):
                continue
            items += 1
            units += work_cost(dump.work(f"{parsed.full_name}.forward") or 0.0, parsed.direction == "backward")
    shard = getattr(option, "msprobe_shard", None)
    if shard is not None:
        units /= shard[1]
        items = math.ceil(items / shard[1])
    return items, units * SECONDS_PER_UNIT


def _selection(config: pytest.Config) -> Callable[[str, list[str], list[str]], bool] | None:
    """-k/-m applied to an entry's name, its markers and its dump's path parts (an estimate's
    selection: the collected items' names hold the same words)."""
    match = matcher(config)
    if match is None:
        return None
    return lambda name, markers, parts: match([name, *parts], markers)


def adapt(config: pytest.Config) -> None:
    """On the controller of `-n N`, before xdist starts anything: fewer workers, or none, when the
    estimated work does not pay for them."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    option = config.option
    asked = getattr(option, "numprocesses", None)
    tx = getattr(option, "tx", None) or []
    if not isinstance(asked, int) or asked < 2 or len(tx) != asked or getattr(option, "dist", "no") not in (
            "load", "worksteal") or getattr(option, "collectonly", False):
        return
    seconds_per_worker = min_work(config)
    if seconds_per_worker <= 0:
        return
    try:
        estimate = estimate_seconds(config)
    except Exception:  # a bad -k expression, an unreadable dump: pytest reports it; start what was asked
        return
    if estimate is None:
        return
    items, seconds = estimate
    worth = min(asked, int(seconds // seconds_per_worker))
    if worth >= asked:
        return
    where = "in this process" if worth < 2 else f"on {worth} workers"
    config.stash[NOTE_KEY] = (f"msprobe: {items} items, about {seconds:.0f} s of estimated work: {where} instead of "
                              f"-n {asked} (a worker costs more to start than it would save; "
                              f"-o msprobe_min_work_per_worker=0 starts every worker)")
    if worth < 2:
        option.dist, option.tx, option.numprocesses = "no", [], 0
    else:
        option.tx, option.numprocesses = tx[:worth], worth


def header_line(config: pytest.Config) -> str | None:
    return config.stash.get(NOTE_KEY, None)

