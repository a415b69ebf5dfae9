"""An append-only journal of finished records, and `--msprobe-resume` built on it.

The controller appends each record as its report arrives (one JSON line, flushed), so a kill loses
only the items in flight; fsync runs with a new record at most once a second, for reboots.
`--lf` cannot resume: it knows failures, not what never ran (NOTES B.13).

Resume keys an item by its nodeid and `entry_key`: a hash of the dump entries it replays and of
the run settings that change results (seed, device, data mode, standard, ...). An edited dump or
another seed therefore reruns the item. Items whose worker crashed are not finished and rerun.
The controller reads the journal before workers start and ships {nodeid: key} in `workerinput`,
so every worker deselects the same items (the journal grows while they collect); each worker
reports back what it deselected, and the controller re-emits those records into the final files.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import IO, Any

import pytest

from .dump import load_dump, parse_entry_name
from .items import ApiItem
from .settings import SETTINGS_KEY, Settings

JOURNAL_NAME = "msprobe_journal.jsonl"
WORKERINPUT_KEY = "msprobe_resume"
WORKEROUTPUT_KEY = "msprobe_resumed"
FSYNC_EVERY_S = 1.0
_NOT_RESULTS = ("out_dir", "api_info", "warning_as_error")  # settings that do not change a record


def run_fingerprint(settings: Settings) -> str:
    """The settings a record depends on; options added to Settings/CheckOptions join automatically."""
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k not in _NOT_RESULTS}
    fields["check_options"].pop("device_index", None)  # differs per worker, same results
    return json.dumps(fields, sort_keys=True, default=str)


def entry_key(dump_path: Path, entry_name: str, fingerprint: str) -> str:
    """Hash of what an item replays: its entries (the forward one for a backward item) and settings."""
    dump = load_dump(dump_path)
    try:
        full = parse_entry_name(entry_name).full_name
        entries = [dump.entry(f"{full}.forward"), dump.entry(f"{full}.backward") if entry_name.endswith(
            ".backward") else None]
    except ValueError:
        entries = [dump.entry(entry_name)]
    payload = json.dumps([entry_name, entries, fingerprint], sort_keys=True, default=str)
    return hashlib.blake2b(payload.encode(), digest_size=10).hexdigest()


class Journal:
    """Controller side: reads the previous journal when resuming, then appends to it."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path, self.resume = path, resume
        self.finished: dict[str, dict[str, Any]] = {}  # nodeid -> record
        self.run_seed: int | None = None
        if resume and path.exists():
            from .report import read_jsonl  # numpy only when resuming, not at plugin load

            for line in read_jsonl(path):
                if "nodeid" not in line:
                    self.run_seed = line.get("run_seed", self.run_seed)
                elif line.get("crashed") or not line.get("entry_key"):
                    self.finished.pop(line["nodeid"], None)
                else:
                    self.finished[line["nodeid"]] = line
        self._file: IO[str] | None = None
        self._synced = 0.0
        self.header: dict[str, Any] = {}
        self.resumed: set[str] = set()  # node ids deselected as finished in this session

    def _open(self) -> IO[str]:
        """On the first record, so --collect-only or an early usage error never truncates a journal."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a" if self.resume else "w", encoding="utf-8")
        self._file.write(json.dumps(self.header) + "\n")
        return self._file

    def resumed_records(self) -> list[dict[str, Any]]:
        return [self.finished[nodeid] for nodeid in sorted(self.resumed) if nodeid in self.finished]

    def keys(self) -> dict[str, str]:
        return {nodeid: rec["entry_key"] for nodeid, rec in self.finished.items()}

    def write(self, record: dict[str, Any]) -> None:
        file = self._file or self._open()
        file.write(json.dumps(record, ensure_ascii=False, allow_nan=True) + "\n")
        file.flush()
        now = time.monotonic()
        if now - self._synced >= FSYNC_EVERY_S:
            os.fsync(file.fileno())
            self._synced = now

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


class Resume:
    """Every process that collects: deselect items whose journaled key still matches."""

    def __init__(self, keys: dict[str, str], fingerprint: str, journal: Journal | None = None) -> None:
        self.keys, self.fingerprint, self.journal = keys, fingerprint, journal

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep, done = [], []
        for item in items:
            key = self.keys.get(item.nodeid)
            if key and isinstance(item, ApiItem) and key == entry_key(item.path, item.name, self.fingerprint):
                done.append(item)
            else:
                keep.append(item)
        if done:
            config.hook.pytest_deselected(items=done)
            items[:] = keep
        resumed = [item.nodeid for item in done]
        if self.journal is not None:  # no xdist: this process is the controller
            self.journal.resumed = set(resumed)
        else:
            config.workeroutput[WORKEROUTPUT_KEY] = resumed  # type: ignore[attr-defined]


class ResumeXdistHooks:
    """Controller side under xdist: ships the keys, gathers what the workers deselected."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.keys = journal.keys()

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKERINPUT_KEY] = self.keys

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        resumed = (getattr(node, "workeroutput", None) or {}).get(WORKEROUTPUT_KEY)
        if resumed is not None:  # every worker deselects the same items; a crashed one reports nothing
            self.journal.resumed = set(resumed)


def _order(record: dict[str, Any]) -> tuple[str, int, bool]:
    return record.get("dump", ""), record.get("order", 0), record.get("direction") != "forward"


def final_records(*batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per node id (a later batch wins), in dump order: what the final files hold."""
    latest: dict[str, dict[str, Any]] = {}
    for batch in batches:
        for record in batch:
            latest[record.get("nodeid") or f"{record.get('api')}.{record.get('direction')}"] = record
    return sorted(latest.values(), key=_order)


JOURNAL_KEY = pytest.StashKey[Journal]()
FINGERPRINT_KEY = pytest.StashKey[str]()


def configure(config: pytest.Config, settings: Settings) -> None:
    """Controller: open the journal (adopting its run seed when resuming without --msprobe-seed).
    Every collecting process with something to resume: the deselecting plugin."""
    resume = bool(config.getoption("msprobe_resume"))
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        keys = workerinput.get(WORKERINPUT_KEY)
        if keys:
            config.pluginmanager.register(Resume(keys, item_fingerprint(config)), "msprobe-resume")
        return
    journal = Journal(settings.out_dir / JOURNAL_NAME, resume)
    if journal.run_seed is not None and config.option.msprobe_seed is None:
        settings.check_options = dataclasses.replace(settings.check_options, run_seed=journal.run_seed)
    journal.header = {"msprobe_journal": 1, "run_seed": settings.check_options.run_seed,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    config.stash[JOURNAL_KEY] = journal
    if not resume:
        return
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "tx", None):
        config.pluginmanager.register(ResumeXdistHooks(journal), "msprobe-resume-xdist")
    else:
        config.pluginmanager.register(Resume(journal.keys(), item_fingerprint(config), journal), "msprobe-resume")


def item_key(item: pytest.Item) -> str:
    return entry_key(item.path, item.name, item_fingerprint(item.config))


def item_fingerprint(config: pytest.Config) -> str:
    """run_fingerprint of this process's settings, computed once."""
    if FINGERPRINT_KEY not in config.stash:
        config.stash[FINGERPRINT_KEY] = run_fingerprint(config.stash[SETTINGS_KEY])
    return config.stash[FINGERPRINT_KEY]
