"""The journal's fsync (once a second, for reboots) runs beside the thread that writes the records, and
closing the journal waits for it and syncs once more."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pytest_msprobe.session import journal


def test_fsync_runs_in_its_own_thread_and_close_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    entered, release = threading.Event(), threading.Event()
    real_fsync = journal.os.fsync

    def slow_fsync(fd: int) -> None:
        """A disk that syncs only when the test says so (at most 5 s)."""
        entered.set()
        release.wait(5)
        real_fsync(fd)
        calls.append(threading.current_thread().name)

    monkeypatch.setattr(journal.os, "fsync", slow_fsync)
    monkeypatch.setattr(journal, "FSYNC_EVERY_S", 0.0)
    log = journal.Journal(tmp_path / journal.JOURNAL_NAME, resume=False)
    for i in range(5):
        log.write({"nodeid": f"d.json::Torch.add.{i}.forward", "status": "pass"})
    # every record written while the first sync still waits for the disk: no write waited for it
    assert entered.wait(5) and calls == []
    lines = [json.loads(line) for line in (tmp_path / journal.JOURNAL_NAME).read_text().splitlines()]
    assert [line.get("nodeid") for line in lines[1:]] == [f"d.json::Torch.add.{i}.forward" for i in range(5)]
    release.set()
    log.close()
    assert len(calls) == 2  # the one in flight (one at a time: the others were skipped), then close's own
    assert calls[0].startswith("msprobe-journal-sync") and calls[1] == threading.current_thread().name
