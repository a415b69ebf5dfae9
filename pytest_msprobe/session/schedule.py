"""The xdist scheduler for dumps (`msprobe_schedule = cost`, the default under `-n`): expensive items first,
dealt by estimated cost, and each `msprobe_filter_api` group on one worker.

xdist's `load` scheduler sends every worker a contiguous quarter of its share up front: with the
items ordered by cost, the first worker gets all the expensive ones (a Llama step's large matmuls)
and finishes long after the others. `worksteal` rebalances by item count, not cost. This scheduler
reads the cost of every item from the dump's index on the controller (shard.item cost model; the
index is built there before the workers start), keeps the pending items sorted most expensive
first, and keeps each worker's queue at two items or at a cost budget that shrinks with the work
left, so an expensive item goes to whichever worker frees up first while cheap items travel in
chunks (fewer messages). Items of one filter-api group go together, so the group's one check runs
on one worker. Collections without dump items are scheduled exactly as xdist's `load` does.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScheduling

from ..dump.reader import Dump, DumpError, load_dump, parse_entry_name
from .shard import ITEM_BASE_COST, work_cost

MIN_PENDING = 2     # a worker runs an item only once it knows the next one (xdist's protocol)
BUDGET_SHARE = 4    # a worker's queue holds at most 1/(BUDGET_SHARE * workers) of the work left


class CostScheduling(LoadScheduling):  # type: ignore[misc]  # xdist ships no type information (no py.typed)
    """LoadScheduling's bookkeeping (nodes, collections, crashes) with cost-ordered dealing.

    `pending` is kept sorted cheapest first, so the next item is popped from its end; an index that
    left with its filter-api group is skipped when it comes up (`taken`).
    """

    collection: list[str] | None  # LoadScheduling's: the one collection every worker reported

    def __init__(self, config: pytest.Config, log: Any = None, filter_api: bool = False) -> None:
        super().__init__(config, log)
        self.filter_api = filter_api
        self.cost: list[float] = []
        self.members: dict[str, list[int]] = {}   # filter-api group -> its indices
        self.group: list[str | None] = []
        self.taken: list[bool] = []
        self.left = 0.0                           # cost of the items not yet sent
        self.queued: dict[Any, float] = {}        # cost sent to a node and not finished
        self.active = False  # False: the collection holds no dump item; LoadScheduling decides

    # ----------------------------------------------------------------- costs and groups
    def _estimate(self, collection: Sequence[str]) -> None:
        root = Path(self.config.rootpath)
        self.cost = [float(ITEM_BASE_COST)] * len(collection)
        self.group = [None] * len(collection)
        self.taken = [False] * len(collection)
        groups: dict[str, dict[str, tuple[str, str]]] = {}
        dumps: dict[str, Dump | None] = {}  # each file looked up once, not per item (a stat and a resolve each)
        for i, nodeid in enumerate(collection):
            path, sep, name = nodeid.partition("::")
            if not sep or not path.endswith(".json"):
                continue
            try:
                parsed = parse_entry_name(name)
                if path not in dumps:
                    dumps[path] = None
                    dumps[path] = load_dump(root / path)
            except (ValueError, DumpError):
                continue
            dump = dumps[path]
            if dump is None:
                continue
            self.active = True
            self.cost[i] = work_cost(dump.work(f"{parsed.full_name}.forward") or 0.0, parsed.direction == "backward")
            if self.filter_api:
                if path not in groups:
                    from ..dump.dedup import groups as find_groups

                    groups[path] = find_groups(dump, dump.entry_names())
                found = groups[path].get(name)
                if found is not None:
                    key = self.group[i] = f"{path}::{found[0]}"
                    self.members.setdefault(key, []).append(i)

    def _sort_pending(self) -> None:
        """Cheapest first (collection order among equals); each index once, none already taken."""
        self.pending[:] = sorted({i for i in self.pending if not self.taken[i]}, key=lambda i: (self.cost[i], -i))
        self.left = sum(self.cost[i] for i in self.pending)

    # ----------------------------------------------------------------- xdist's Scheduling protocol
    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # a node added later: the same as check_schedule
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        collection = next(iter(self.node2collection.values()))
        self._estimate(collection)
        if not self.active:
            super().schedule()
            return
        self.collection = collection
        self.pending[:] = range(len(collection))
        self._sort_pending()
        if self.pending:
            self._deal()

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if not self.active:
            super().check_schedule(node, duration)
            return
        if node.shutting_down:
            return
        if self.pending:
            self._deal()
        else:
            node.shutdown()

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        if self.active:
            self.queued[node] = self.queued.get(node, 0.0) - self.cost[item_index]
        super().mark_test_complete(node, item_index, duration)

    def mark_test_pending(self, item: str) -> None:
        if self.active:
            assert self.collection is not None
            self.taken[self.collection.index(item)] = False
        super().mark_test_pending(item)  # puts it back in pending (and deals)
        if self.active:
            self._sort_pending()

    def remove_node(self, node: Any) -> str | None:
        requeued = list(self.node2pending.get(node, ()))[1:]  # all but the item it was running
        self.queued.pop(node, None)
        if self.active:
            for i in requeued:
                self.taken[i] = False
        crashitem: str | None = super().remove_node(node)  # puts them back in pending (and deals)
        if self.active:
            self._sort_pending()
        return crashitem

    # ----------------------------------------------------------------- dealing
    def _deal(self) -> None:
        """The most expensive pending item to the worker with the least queued work. A worker is refilled
        once its queue is under MIN_PENDING items or half its share of the work left (BUDGET_SHARE), up to
        that share: cheap items travel in chunks, an expensive one alone. With nothing left, idle workers
        stop."""
        nodes = [n for n in self.node2pending if not n.shutting_down]
        if not nodes:
            return
        budget = self.left / (BUDGET_SHARE * len(nodes))
        chunk_cap = self.maxschedchunk or len(self.collection or ())
        refill = [n for n in nodes if len(self.node2pending[n]) < MIN_PENDING or self.queued.get(n, 0.0) < budget / 2]
        outgoing: dict[Any, list[int]] = {n: [] for n in refill}
        while self.pending:
            ready = [n for n in refill if self._wants(n, budget, len(outgoing[n]), chunk_cap)]
            if not ready:
                break
            node = min(ready, key=lambda n: (self.queued.get(n, 0.0), len(self.node2pending[n]) + len(outgoing[n])))
            for index in self._take():
                outgoing[node].append(index)
                self.queued[node] = self.queued.get(node, 0.0) + self.cost[index]
        for node, indices in outgoing.items():
            if indices:
                self.node2pending[node].extend(indices)
                node.send_runtest_some(indices)
        if not self.pending:
            for node in nodes:
                if not self.node2pending[node]:
                    node.shutdown()

    def _wants(self, node: Any, budget: float, sent: int, chunk_cap: int) -> bool:
        if len(self.node2pending[node]) + sent < MIN_PENDING:
            return True
        return sent < chunk_cap and self.queued.get(node, 0.0) + self.cost[self.pending[-1]] <= budget

    def _take(self) -> list[int]:
        """The next item, with the rest of its filter-api group; skips indices already taken."""
        first = self.pending.pop()
        taken = [first]
        group = self.group[first]
        if group is not None:
            taken += [i for i in self.members[group] if i != first and not self.taken[i]]
        for i in taken:
            self.taken[i] = True
            self.left -= self.cost[i]
        while self.pending and self.taken[self.pending[-1]]:  # members that left with their group
            self.pending.pop()
        return taken
