"""The cost scheduler with stand-in xdist nodes: expensive items first and spread, cheap ones in chunks,
filter-api groups together, crashed nodes' items dealt again, plain tests left to xdist's logic."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_dump, tensor

pytest.importorskip("xdist")

from pytest_msprobe.session.schedule import MIN_PENDING, CostScheduling  # noqa: E402


class Node:
    def __init__(self, name: str) -> None:
        self.name, self.shutting_down, self.sent = name, False, []
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(list(indices))

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return self.name


class Config:
    def __init__(self, root: Path, workers: int) -> None:
        self.rootpath = root
        self.values = {"tx": [f"{workers}*popen"], "maxschedchunk": None}

    def getvalue(self, name: str) -> Any:
        return self.values[name]

    getoption = getvalue


def linear(m: int, k: int, n: int) -> dict[str, Any]:
    return {"input_args": [tensor(shape=[m, k]), tensor(shape=[n, k])], "input_kwargs": {},
            "output": [tensor(shape=[m, n])]}


def relu(shape: list[int], **kw: Any) -> dict[str, Any]:
    return {"input_args": [tensor(shape=shape, **kw)], "input_kwargs": {}, "output": [tensor(shape=shape)]}


def start(pytester: pytest.Pytester, data: dict[str, Any], workers: int = 2,
          filter_api: bool = False) -> tuple[CostScheduling, list[Node], list[str]]:
    make_dump(pytester, data)
    sched = CostScheduling(Config(pytester.path, workers), filter_api=filter_api)  # type: ignore[arg-type]
    nodes = [Node(f"gw{k}") for k in range(workers)]
    ids = [f"d/dump.json::{name}" for name in data]
    for node in nodes:
        sched.add_node(node)  # type: ignore[arg-type]
        sched.add_node_collection(node, ids)  # type: ignore[arg-type]
    sched.schedule()
    return sched, nodes, ids


def run_all(sched: CostScheduling, nodes: list[Node]) -> dict[str, list[int]]:
    """Finish items in queue order, taking turns between the busy nodes; the order each node ran them.
    A node runs its last item after xdist told it to shut down, as a real worker does."""
    ran: dict[str, list[int]] = {n.name: [] for n in nodes}
    turn = 0
    while any(sched.node2pending[n] for n in nodes):
        busy = [n for n in nodes if sched.node2pending[n]]
        node = busy[turn % len(busy)]
        turn += 1
        index = sched.node2pending[node][0]
        ran[node.name].append(index)
        sched.mark_test_complete(node, index)  # type: ignore[arg-type]
    assert sched.tests_finished
    return ran


def test_expensive_items_go_first_and_to_both_workers(pytester: pytest.Pytester) -> None:
    data = {f"Functional.relu.{i}.forward": relu([4, 8]) for i in range(40)}
    data.update({f"Functional.linear.{i}.forward": linear(512, 1024, 1024 * (i + 1)) for i in range(4)})
    sched, nodes, ids = start(pytester, data)
    first = [ids[batch[0]] for node in nodes for batch in node.sent[:1]]
    big = {ids.index(f"d/dump.json::Functional.linear.{i}.forward") for i in range(4)}
    # the two largest matmuls start on different workers, before any relu
    assert sorted(first) == ["d/dump.json::Functional.linear.2.forward", "d/dump.json::Functional.linear.3.forward"]
    ran = run_all(sched, nodes)
    assert sorted(i for r in ran.values() for i in r) == list(range(len(ids)))  # each item exactly once
    for order in ran.values():
        assert [i for i in order if i in big] == order[:len([i for i in order if i in big])]  # big ones first
    assert all(len([i for i in order if i in big]) == 2 for order in ran.values())


def test_each_dump_is_looked_up_once(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller estimates every item's cost from one look-up of its dump, not one per item (each a
    stat and a path resolve: 0.13 s of the controller's profile on a 484-call step)."""
    from pytest_msprobe.session import schedule

    calls: list[Path] = []

    def counted(path: Path) -> Any:
        calls.append(path)
        return load_dump(path)

    load_dump = schedule.load_dump
    monkeypatch.setattr(schedule, "load_dump", counted)
    data = {f"Functional.relu.{i}.forward": relu([4, 8 * (i + 1)]) for i in range(12)}
    sched, nodes, ids = start(pytester, data)
    assert calls == [pytester.path / "d/dump.json"]
    assert sched.active and len(set(sched.cost)) == 12  # every item still got its own cost
    assert sorted(i for r in run_all(sched, nodes).values() for i in r) == list(range(len(ids)))


def test_cheap_items_travel_in_chunks(pytester: pytest.Pytester) -> None:
    data = {f"Functional.relu.{i}.forward": relu([4, 8]) for i in range(400)}
    sched, nodes, _ = start(pytester, data)
    first_batch = [len(node.sent[0]) for node in nodes]
    assert all(size > MIN_PENDING * 10 for size in first_batch)  # not one message per item
    run_all(sched, nodes)
    sent = sum(len(batch) for node in nodes for batch in node.sent)
    messages = sum(len(node.sent) for node in nodes)
    assert sent == 400 and messages <= 400 // 5  # five items a message or more on average


def test_a_filter_group_goes_to_one_worker(pytester: pytest.Pytester) -> None:
    data = {f"Functional.relu.{i}.forward": relu([64, 64]) for i in range(6)}        # one group of six
    data.update({f"Functional.gelu.{i}.forward": relu([64, 64], Mean=float(i)) for i in range(6)})  # no group
    sched, nodes, ids = start(pytester, data, filter_api=True)
    ran = run_all(sched, nodes)
    group = {ids.index(f"d/dump.json::Functional.relu.{i}.forward") for i in range(6)}
    holders = [name for name, order in ran.items() if group & set(order)]
    assert len(holders) == 1 and group <= set(ran[holders[0]])
    assert sorted(i for r in ran.values() for i in r) == list(range(len(ids)))


def test_a_crashed_workers_queue_is_dealt_again(pytester: pytest.Pytester) -> None:
    data = {f"Functional.relu.{i}.forward": relu([8, 8 * (i + 1)]) for i in range(30)}
    sched, nodes, ids = start(pytester, data)
    dead = nodes[0]
    queue = list(sched.node2pending[dead])
    crashed = sched.remove_node(dead)  # type: ignore[arg-type]
    assert crashed == ids[queue[0]]
    ran = run_all(sched, nodes[1:])
    assert sorted(ran["gw1"]) == sorted(set(range(len(ids))) - {queue[0]})


def test_without_dump_items_it_is_xdists_load_scheduling(pytester: pytest.Pytester) -> None:
    sched = CostScheduling(Config(pytester.path, 2))  # type: ignore[arg-type]
    nodes = [Node("gw0"), Node("gw1")]
    ids = [f"test_x.py::test_{i}" for i in range(40)]
    for node in nodes:
        sched.add_node(node)  # type: ignore[arg-type]
        sched.add_node_collection(node, ids)  # type: ignore[arg-type]
    sched.schedule()
    assert not sched.active
    assert [node.sent for node in nodes] == [[list(range(0, 5))], [list(range(5, 10))]]  # load's first chunks
