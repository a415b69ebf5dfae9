"""The journal's fsync (once a second, for reboots) runs beside the thread that writes the records, and
closing the journal waits for it and syncs once more."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from pytest_msprobe.session import journal


def test_fsync_runs_in_its_own_thread_and_close_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, float, float]] = []
    real_fsync = journal.os.fsync

    def slow_fsync(fd: int) -> None:
        started = time.monotonic()
        time.sleep(0.05)  # a slow disk
        real_fsync(fd)
        calls.append((threading.current_thread().name, started, time.monotonic()))

    monkeypatch.setattr(journal.os, "fsync", slow_fsync)
    monkeypatch.setattr(journal, "FSYNC_EVERY_S", 0.0)
    log = journal.Journal(tmp_path / journal.JOURNAL_NAME, resume=False)
    started = time.monotonic()
    for i in range(5):
        log.write({"nodeid": f"d.json::Torch.add.{i}.forward", "status": "pass"})
    assert time.monotonic() - started < 0.05  # no write waited for a disk sync
    log.close()
    closed = time.monotonic()
    assert [name.startswith("msprobe-journal-sync") for name, _, _ in calls[:-1]] == [True] * (len(calls) - 1)
    assert len(calls) >= 2 and calls[-1][0] == threading.current_thread().name  # the last one, in close
    assert all(end <= calls[-1][1] for _, _, end in calls[:-1]) and calls[-1][2] <= closed  # pending one first
    lines = [json.loads(line) for line in (tmp_path / journal.JOURNAL_NAME).read_text().splitlines()]
    assert [line.get("nodeid") for line in lines[1:]] == [f"d.json::Torch.add.{i}.forward" for i in range(5)]
