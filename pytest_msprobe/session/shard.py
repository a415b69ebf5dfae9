"""Estimated item cost, `--msprobe-shard K/N`, and expensive-items-first ordering under xdist.

Cost is an estimate from the dump alone (no torch): the work estimate of the call from its input
shapes (dumpindex.work: elements, plus multiply-adds for matmuls, convolutions and attention) plus a
fixed per-item cost, tripled for a backward item (forward with autograd, then
backward, on both sides). Sharding runs longest-processing-time-first inside every dump, so each
shard gets a balanced part of every dump; the result depends only on that dump's contents, so it
is the same on every machine, every xdist worker, and with `--lf` (which drops whole files).
"""
from __future__ import annotations

import argparse
import heapq
import zlib
from collections import defaultdict

import pytest

from ..dump.reader import load_dump, parse_entry_name
from .items import ApiItem

ITEM_BASE_COST = 100_000   # element-equivalents of the fixed per-item work (inputs, two launches, compare)
BACKWARD_FACTOR = 3
COST_KEY = pytest.StashKey[float]()


def parse_shard(value: str) -> tuple[int, int]:
    """argparse type for K/N (1-based)."""
    k, sep, n = value.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"--msprobe-shard wants K/N with 1 <= K <= N, got {value!r}")
    return int(k), int(n)


def work_cost(work: float, backward: bool) -> float:
    return (ITEM_BASE_COST + work) * (BACKWARD_FACTOR if backward else 1)


def item_cost(item: pytest.Item) -> float:
    cost = item.stash.get(COST_KEY, None)
    if cost is None:
        cost = float(ITEM_BASE_COST)
        if isinstance(item, ApiItem):
            try:
                name = parse_entry_name(item.name)
                work = load_dump(item.path).work(f"{name.full_name}.forward")
                cost = work_cost(work or 0.0, name.direction == "backward")
            except Exception:  # an entry the item itself will report
                pass
        item.stash[COST_KEY] = cost
    return cost


def assign(costs: list[float], n: int, offset: int = 0) -> list[int]:
    """LPT: each item, most expensive first, to the least loaded shard (ties rotate by `offset`)."""
    heap = [(0.0, (s - offset) % n, s) for s in range(n)]  # (load, tie-break rank, shard)
    shard = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, rank, s = heapq.heappop(heap)
        shard[i] = s
        heapq.heappush(heap, (load + costs[i], rank, s))
    return shard


class Shard:
    """Keeps shard K of N of every dump; runs before -k/-m so membership ignores the selection."""

    def __init__(self, k: int, n: int) -> None:
        self.k, self.n = k, n

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            groups[str(item.path)].append(i)
        mine: set[int] = set()
        for indices in groups.values():
            rel = items[indices[0]].nodeid.split("::", 1)[0]
            shards = assign([item_cost(items[i]) for i in indices], self.n, zlib.crc32(rel.encode()) % self.n)
            mine.update(i for i, s in zip(indices, shards) if s == self.k - 1)
        config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i not in mine])
        items[:] = [item for i, item in enumerate(items) if i in mine]


class CostOrder:
    """Under xdist's load scheduling the last items decide the finish: run expensive ones first."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # stable: ties keep the collection order, except that an msprobe_filter_api group stays together
        items.sort(key=lambda item: (-item_cost(item), (getattr(item, "reuse", None) or ("",))[0]))


def configure(config: pytest.Config) -> None:
    """Sharding and ordering happen where items are collected (every worker, or the only process)."""
    shard = config.getoption("msprobe_shard")
    if shard is not None:
        config.pluginmanager.register(Shard(*shard), "msprobe-shard")
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(CostOrder(), "msprobe-cost-order")
