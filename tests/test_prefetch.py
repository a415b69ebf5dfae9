"""The next item's inputs are built in the helper thread while this item runs, with the same values."""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from pytest_msprobe.check import check_entry, prepare
from pytest_msprobe.dump.reader import load_dump
from pytest_msprobe.helper import helper
from pytest_msprobe.records.record import Record
from pytest_msprobe.session import devices
from pytest_msprobe.settings import CheckOptions
from pytest_msprobe.specs.loader import load_specs
from tests.helpers import EXAMPLES, api_records, copy_dump, make_dump, tensor

SPECS = load_specs()
TWO = CheckOptions(device="cpu", standard="strict", work_threads=2)


def _builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread of every build_inputs call from now on."""
    threads: list[str] = []
    plain = prepare.build_inputs

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return plain(*args)

    monkeypatch.setattr(prepare, "build_inputs", spy)
    return threads


def _dump(write_dump: Any) -> Any:
    big = [1 << 11, (1 << 10) + 3]  # over 2**20 elements: drawn in chunks
    data = {
        "Functional.gelu.0.forward": {"input_args": [tensor("torch.bfloat16", big, mx=3.0, mn=-3.0)],
                                      "input_kwargs": {}, "output": [tensor("torch.bfloat16", big)]},
        "Functional.silu.1.forward": {"input_args": [tensor("torch.float32", [64, 8], mx=2.0, mn=-2.0,
                                                            requires_grad=True)],
                                      "input_kwargs": {}, "output": [tensor("torch.float32", [64, 8])]},
        "Functional.silu.1.backward": {"input": [tensor("torch.float32", [64, 8])],
                                       "output": [tensor("torch.float32", [64, 8])]},
    }
    return load_dump(write_dump(data))


def _outputs(record: Record | dict[str, Any]) -> tuple[Any, ...]:
    """What the check judged, in the plain form (a records file holds that)."""
    plain = record.to_dict() if isinstance(record, Record) else record
    return plain["status"], plain["outputs"], plain["notes"], plain.get("data")


@pytest.mark.parametrize("entry", ["Functional.gelu.0.forward", "Functional.silu.1.backward"])
def test_prefetched_inputs_give_the_same_record(write_dump, monkeypatch, entry: str) -> None:
    dump = _dump(write_dump)
    fresh = check_entry(dump, entry, dataclasses.replace(TWO, work_threads=1), SPECS)
    threads = _builds(monkeypatch)
    prepare.prefetch(dump, entry, TWO, SPECS)
    fetched = check_entry(dump, entry, TWO, SPECS)
    assert threads == ["msprobe-helper_0"]  # built once, in the helper, and taken by the check
    assert _outputs(fetched) == _outputs(fresh) and fetched.status == "pass"


def test_a_prefetch_is_taken_only_by_its_own_check(write_dump, monkeypatch) -> None:
    dump = _dump(write_dump)
    threads = _builds(monkeypatch)
    prepare.prefetch(dump, "Functional.gelu.0.forward", TWO, SPECS)
    started, _ = list(prepare._pending.values())[-1]
    deadline = time.monotonic() + 10  # the helper has begun it (a new thread, or one busy with an earlier
    while not (started.running() or started.done()) and time.monotonic() < deadline:  # test's work, may not
        time.sleep(0.001)  # have yet): no later wait builds it here
    assert started.running() or started.done()
    other = dataclasses.replace(TWO, run_seed=7)  # another seed: other inputs
    check_entry(dump, "Functional.gelu.0.forward", other, SPECS)
    check_entry(dump, "Functional.silu.1.forward", TWO, SPECS)
    assert sorted(threads) == ["MainThread", "MainThread", "msprobe-helper_0"]  # the helper's own runs beside


def test_a_build_the_helper_has_not_started_is_made_by_the_waiting_thread(write_dump, monkeypatch) -> None:
    """While the helper is busy (with the bench), build_pending_here builds the queued inputs in this thread; the
    item takes them (no second build) and its record is the same."""
    dump = _dump(write_dump)
    fresh = check_entry(dump, "Functional.silu.1.backward", dataclasses.replace(TWO, work_threads=1), SPECS)
    threads = _builds(monkeypatch)
    release = threading.Event()
    busy = helper().submit(release.wait)
    try:
        prepare.prefetch(dump, "Functional.silu.1.backward", TWO, SPECS)
        prepare.build_pending_here()
        assert threads == ["MainThread"]
    finally:
        release.set()
        busy.result()
    fetched = check_entry(dump, "Functional.silu.1.backward", TWO, SPECS)
    assert threads == ["MainThread"] and _outputs(fetched) == _outputs(fresh)


def test_no_prefetch_without_a_spare_core_or_for_an_entry_that_is_not_checkable(write_dump, monkeypatch) -> None:
    dump = _dump(write_dump)
    threads = _builds(monkeypatch)
    prepare.prefetch(dump, "Functional.gelu.0.forward", dataclasses.replace(TWO, work_threads=1), SPECS)
    prepare.prefetch(dump, "Functional.gelu.9.forward", TWO, SPECS)  # not in the dump: the item says so
    prepare.prefetch(dump, "not an entry name", TWO, SPECS)
    assert threads == []
    assert check_entry(dump, "Functional.gelu.9.forward", TWO, SPECS).status == "SKIP"


def test_items_run_in_one_process_use_the_next_items_prefetch(pytester: pytest.Pytester, monkeypatch) -> None:
    dump = copy_dump(pytester, EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0", "d")
    threads = _builds(monkeypatch)
    runs = {}
    for spare in (1, 2):
        monkeypatch.setattr(devices, "work_threads", lambda threads, *where, spare=spare: spare)  # on any machine
        threads.clear()
        result = pytester.runpytest_inprocess(str(dump), "--msprobe-device", "cpu", "-p", "no:randomly",
                                              "--msprobe-out", f"out{spare}")
        assert result.ret == 0
        runs[spare] = (list(threads), api_records(pytester, f"out{spare}"))
    (alone, first), (beside, second) = runs[1], runs[2]
    assert set(alone) == {"MainThread"} and len(alone) >= 10
    # with a spare core each item's inputs are built once: the first item's by itself, every later one's while the
    # item before it ran (in the helper, or in the items' thread while that item waited for its bench beside it)
    assert len(beside) == len(alone) and beside[0] == "MainThread"
    assert {k: _outputs(r) for k, r in first.items()} == {k: _outputs(r) for k, r in second.items()}


def test_an_item_looks_its_dump_up_once(pytester: pytest.Pytester, monkeypatch) -> None:
    """Each load_dump stats the file (a GIL release, which right after the next item's inputs went to the
    helper thread waited 0.5-2 ms for the GIL): the item's check, the next item's prefetch and the
    journal's key share one look-up."""
    from pytest_msprobe.dump import reader

    dump = copy_dump(pytester, EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0", "d")
    calls: list[str] = []
    plain = reader.load_dump

    def counted(path: Any, *args: Any) -> Any:
        calls.append(str(path))
        return plain(path, *args)

    for module in ("pytest_msprobe.session.items", "pytest_msprobe.session.journal"):
        monkeypatch.setattr(f"{module}.load_dump", counted)
    monkeypatch.setattr(devices, "work_threads", lambda threads, *where: 2)  # the next item's prefetch, on any machine
    result = pytester.runpytest_inprocess(str(dump), "--msprobe-device", "cpu", "-p", "no:randomly",
                                          "--msprobe-out", "out")
    records = api_records(pytester, "out")
    assert result.ret == 0 and len(records) >= 10
    assert calls == [str(dump)] * len(records)


def test_the_next_items_build_starts_when_this_items_sides_are_made(pytester: pytest.Pytester, monkeypatch) -> None:
    """The hand-over comes after the item's own sides are made: the sides' copies take and drop the GIL per
    tensor, and each waited for it while the helper thread built the next item's inputs in Python beside them.
    With the bench beside the device it comes after the device's runs, behind this item's metrics in the helper's
    queue, and the bench's side is made in the helper (the items' thread makes the device's alone); else (a call
    that may draw random numbers) just before the device run, both sides made here. An item skipped before its
    runs hands nothing over."""
    from pytest_msprobe.check import placement
    from pytest_msprobe.runs import backends

    dump = copy_dump(pytester, EXAMPLES / "mlp_bf16_statistics" / "step0" / "rank0", "d")
    events: list[str] = []

    def logged(what: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                events.append(what)
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(prepare, "prefetch", logged("prefetch", prepare.prefetch))
    monkeypatch.setattr(placement, "make_side", logged("side", placement.make_side))
    monkeypatch.setattr(backends, "device_call", logged("device", backends.device_call))
    monkeypatch.setattr(devices, "work_threads", lambda threads, *where: 2)  # the next item's prefetch, on any machine
    result = pytester.runpytest_inprocess(str(dump), "--msprobe-device", "cpu", "-p", "no:randomly",
                                          "--msprobe-out", "out")
    records = api_records(pytester, "out")
    assert result.ret == 0 and len(records) >= 10
    assert events.count("prefetch") == len(records) - 1  # every item but the last hands the next one over
    orders = set()
    for i, event in enumerate(events):
        if event == "prefetch":
            item = events[:i][::-1]
            item = item[:item.index("side")][::-1]  # since the item's last side
            assert item in ([], ["device"], ["device", "device"]), item  # no device run, forward, and backward
            sides = 1 if item else 2  # the device's alone, or the bench's too
            before = events[:i - len(item)]
            assert before[-sides:] == ["side"] * sides and before[-sides - 1:-sides] != ["side"], \
                events[max(0, i - 5):i + 2]
            assert item or events[i + 1] == "device", events[max(0, i - 3):i + 2]
            orders.add("after the device" if item else "before the device")
    assert orders == {"after the device", "before the device"}  # both kinds of item in this dump
    prepare.prefetch_later(lambda: events.append("stale"))
    prepare.prefetch_later(None)  # what an item that skipped before its runs leaves behind
    prepare.start_prefetch()
    assert "stale" not in events


def test_an_item_checked_in_pieces_hands_no_build_over(pytester: pytest.Pytester, monkeypatch) -> None:
    """The next item's inputs, built beside an item checked in pieces, would hold memory the pieces' budget
    does not count: the pieces make no bench side, where the hand-over happens, so that item builds its own."""
    big = [1024, 1024]
    entry = {"input_args": [tensor("torch.bfloat16", big, mx=3.0, mn=-3.0)], "input_kwargs": {},
             "output": [tensor("torch.bfloat16", big)]}
    small = {"input_args": [tensor("torch.float32", [64, 8])], "input_kwargs": {}, "output": [tensor("torch.float32", [64, 8])]}
    dump = make_dump(pytester, {"Functional.silu.0.forward": entry, "Functional.gelu.1.forward": small,
                                "Functional.gelu.2.forward": small})
    handed: list[str] = []
    plain = prepare.prefetch
    monkeypatch.setattr(prepare, "prefetch", lambda d, name, *a: handed.append(name) or plain(d, name, *a))
    monkeypatch.setattr(devices, "work_threads", lambda threads, *where: 2)  # the next item's prefetch, on any machine
    result = pytester.runpytest_inprocess(str(dump), "--msprobe-device", "cpu", "-p", "no:randomly",
                                          "--msprobe-max-memory", "4MiB", "--msprobe-out", "out")
    records = api_records(pytester, "out")
    assert result.ret == 0 and records["Functional.silu.0.forward"]["pieces"]
    assert handed == ["Functional.gelu.2.forward"]  # gelu.1 handed gelu.2 over; silu.0, in pieces, nothing
