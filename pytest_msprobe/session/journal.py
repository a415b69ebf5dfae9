"""An append-only journal of finished records, and `--msprobe-resume` built on it.

The controller appends each record as its report arrives (one JSON line, flushed), so a kill loses
only the items in flight; fsync runs with a new record at most once a second, for reboots, in a thread
of its own (8-10 ms each on the development machine's disk, which at -n 0 held up the items' thread),
and once more, waited for, when the journal closes.
`--lf` cannot resume: it knows failures, not what never ran (NOTES B.13).

Resume finds an item by its `item_id` (the dump file's resolved path and the entry name: pytest's
rootdir and node ids change with how the command is spelled and where it runs, the file does not)
and checks its `entry_key`: a hash of the dump entries it replays and of the run settings that
change results (seed, device, data mode, standard, ...). An edited dump or another seed therefore
reruns the item. Items whose worker crashed are not finished and rerun.
The controller reads the journal before workers start and ships {dump file: {entry: key}} in
`workerinput`, so every worker leaves out the same items (the journal grows while they collect);
each worker reports back what it left out, and after the run loop the controller reports those
items with their journaled results (pass, fail, skip, baseline xfail), as if they had run: the exit
status, the short summary, JUnit XML and the files cover every item. A resumed run's result files
replace the ones earlier runs of the same journal wrote (their names are journaled).

An `<entry>[fuzz]` item (--msprobe-fuzz) is journaled as a `{"fuzz": result}` line under its own
item id; its key adds the number of examples. It is resumed like an API item, and its result goes
to the triage summary and the HTML page, never into msprobe's CSVs (no API call of the dump).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Literal

import pytest

from ..dump.reader import Dump, load_dump, parse_entry_name
from ..inputs.seeds import GENERATOR
from ..records import wire
from ..records.record import Record
from ..settings import Settings
from .items import ApiItem
from .stash import SETTINGS_KEY

JOURNAL_NAME = "msprobe_journal.jsonl"
WORKERINPUT_KEY = "msprobe_resume"
WORKEROUTPUT_KEY = "msprobe_resumed"
RESUMED_IDS = "msprobe_resumed_ids"  # a worker's first report carries the items it left out, for the progress
FSYNC_EVERY_S = 1.0
_NOT_RESULTS = ("out_dir", "api_info", "warning_as_error")  # settings that do not change a record


def run_fingerprint(settings: Settings) -> str:
    """The settings a record depends on; options added to Settings/CheckOptions join automatically."""
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k not in _NOT_RESULTS}
    # differ per worker, or say where the strict checks run (the same verdicts): same results
    for per_process in ("device_index", "work_threads", "checks_on"):
        fields["check_options"].pop(per_process, None)
    fields["inputs"] = GENERATOR  # random inputs of another generator are other inputs for the same seed
    return json.dumps(fields, sort_keys=True, default=str)


def entry_key(dump_path: Path, entry_name: str, fingerprint: str, dump: Dump | None = None) -> str:
    """Hash of what an item replays: its entries (the forward one for a backward item) and settings.
    `dump`: the dump at dump_path as the item read it, if it did."""
    dump = dump or load_dump(dump_path)
    try:
        full = parse_entry_name(entry_name).full_name
        entries = [dump.entry(f"{full}.forward"), dump.entry(f"{full}.backward") if entry_name.endswith(
            ".backward") else None]
    except ValueError:
        entries = [dump.entry(entry_name)]
    payload = json.dumps([entry_name, entries, fingerprint], sort_keys=True, default=str)
    return hashlib.blake2b(payload.encode(), digest_size=10).hexdigest()


@functools.cache
def _syncer() -> ThreadPoolExecutor:
    """The journal's fsync thread (the controller's only journal; not the checks' helper thread)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-journal-sync")


@functools.cache
def dump_file(path: Path | str) -> str:
    """The dump's resolved absolute path: the same whatever the rootdir or working directory."""
    return Path(path).resolve().as_posix()


def item_id(path: Path | str, entry_name: str) -> str:
    """What resume finds a journaled result by."""
    return f"{dump_file(path)}::{entry_name}"


# result files a resumed run may remove: only these names, and only in the --msprobe-out folder
_RESULT_PREFIXES = ("accuracy_checking_", "api_precision_compare_", "msprobe_records_")


class Journal:
    """Controller side: reads the previous journal when resuming, then appends to it."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path, self.resume = path, resume
        self.finished: dict[str, Record | dict[str, Any]] = {}  # item_id -> its record, or a [fuzz] item's line
        self.run_seed: int | None = None
        self.earlier_files: list[str] = []  # result files earlier runs of this journal wrote
        if resume and path.exists():
            from ..reports.results import read_jsonl  # numpy only when resuming, not at plugin load

            for line in read_jsonl(path):
                if "nodeid" not in line:
                    self.run_seed = line.get("run_seed", self.run_seed)
                    self.earlier_files += line.get("msprobe_written", [])
                elif not line.get("item_id"):
                    continue  # a journal of an older version: its items run again
                elif line.get("crashed") or not line.get("entry_key") or (finished := _finished(line)) is None:
                    self.finished.pop(line["item_id"], None)
                else:
                    self.finished[line["item_id"]] = finished
        self._file: IO[str] | None = None
        self._synced = 0.0
        self._sync: Future[None] | None = None  # the fsync running in _syncer's thread
        self.header: dict[str, Any] = {}
        self.resumed: dict[str, str] = {}  # item_id -> this session's node id, left out as finished
        self.reported = False  # the resumed items' reports were emitted
        self.counted = 0  # resumed items already in session.testscollected (incomplete.py)

    def _open(self) -> IO[str]:
        """On the first record, so --collect-only or an early usage error never truncates a journal."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a" if self.resume else "w", encoding="utf-8")
        self._file.write(json.dumps(self.header) + "\n")
        return self._file

    def resumed_records(self) -> list[Record]:
        """The journaled records of the API items left out, with this session's node id and dump path, in dump
        order (as they ran)."""
        records = []
        for record, nodeid in self._resumed(Record):
            record.nodeid, record.dump = nodeid, nodeid.rpartition("::")[0]
            records.append(record)
        return sorted(records, key=_order)

    def resumed_fuzz(self) -> list[dict[str, Any]]:
        """The journal lines of the [fuzz] items left out ({"fuzz": result, ...}), as `resumed_records`."""
        return sorted((dict(line, nodeid=nodeid, dump=nodeid.rpartition("::")[0], fuzz=wire.typed_fuzz(line["fuzz"]))
                       for line, nodeid in self._resumed(dict)), key=_order)

    def _resumed(self, kind: type[Any]) -> list[tuple[Any, str]]:
        """(finished record or line, this session's node id) of the items left out whose finished entry is a
        `kind`."""
        return [(self.finished[iid], nodeid) for iid, nodeid in self.resumed.items()
                if isinstance(self.finished.get(iid), kind)]

    def keys(self) -> dict[str, dict[str, str]]:
        """{dump file: {entry name: entry_key}} of the finished items."""
        keys: dict[str, dict[str, str]] = {}
        for iid, rec in self.finished.items():
            path, _, name = iid.rpartition("::")
            keys.setdefault(path, {})[name] = str(rec.entry_key if isinstance(rec, Record) else rec["entry_key"])
        return keys

    def write(self, record: Record | dict[str, Any]) -> None:
        """One finished item: its record, or a [fuzz] item's line."""
        file = self._file or self._open()
        line = record.to_dict() if isinstance(record, Record) else record
        file.write(json.dumps(line, ensure_ascii=False, allow_nan=True, default=_plain) + "\n")
        file.flush()
        now = time.monotonic()
        if now - self._synced >= FSYNC_EVERY_S and (self._sync is None or self._sync.done()):
            self._sync = _syncer().submit(os.fsync, file.fileno())
            self._synced = now

    def supersede(self, written: dict[str, Path]) -> list[Path]:
        """Journal this session's result files; when resuming, remove those of earlier runs (each a
        part of what this set holds), so one set remains. Returns the removed files."""
        out_dir = self.path.parent
        names = sorted({p.name for p in written.values() if p.parent == out_dir})
        file = self._file or self._open()
        file.write(json.dumps({"msprobe_written": names}) + "\n")
        removed = []
        for name in dict.fromkeys(self.earlier_files) if self.resume else ():
            path = out_dir / name
            if name not in names and os.sep not in name and name.startswith(_RESULT_PREFIXES) and path.is_file():
                path.unlink()
                removed.append(path)
        return removed

    def close(self) -> None:
        if self._file is not None:
            if self._sync is not None:
                with contextlib.suppress(OSError):  # the fsync below raises it again
                    self._sync.result()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


class Resume:
    """Every process that collects: leave out items whose journaled key still matches."""

    def __init__(self, keys: dict[str, dict[str, str]], fingerprint: str, journal: Journal | None = None) -> None:
        self.keys, self.fingerprint, self.journal = keys, fingerprint, journal
        self.unsent: list[list[str]] | None = None  # worker: the items left out, not yet told the controller

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep, done = [], []
        for item in items:
            if isinstance(item, ApiItem) or _fuzz_target(item):
                key = self.keys.get(dump_file(item.path), {}).get(item.name)
                if key and key == item_key(item, self.fingerprint):
                    done.append(item)
                    continue
            keep.append(item)
        items[:] = keep  # not "deselected": they are reported with their journaled results after the run
        resumed = [[item_id(item.path, item.name), item.nodeid] for item in done]
        if self.journal is not None:  # no xdist: this process is the controller
            self.journal.resumed = dict(resumed)
        else:
            config.workeroutput[WORKEROUTPUT_KEY] = resumed  # type: ignore[attr-defined]
            self.unsent = resumed

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Worker: the first report carries what was left out (workeroutput comes only at the end)."""
        if self.unsent is not None:
            setattr(report, RESUMED_IDS, self.unsent)
            self.unsent = None


class ResumeXdistHooks:
    """Controller side under xdist: ships the keys, gathers what the workers left out."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.keys = journal.keys()

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKERINPUT_KEY] = self.keys

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        resumed = (getattr(node, "workeroutput", None) or {}).get(WORKEROUTPUT_KEY)
        if resumed is not None:  # every worker leaves out the same items; a crashed one reports nothing
            self.journal.resumed = dict(resumed)


def report_resumed(config: pytest.Config, session: pytest.Session, journal: Journal) -> int:
    """Controller, after the run loop: report every item left out with its journaled result, through
    the same hooks a run uses (terminal, short summary, JUnit, --lf cache, exit status)."""
    from ..reports.summary import junit_properties
    from . import baseline
    from .items import heading, log_report, note_dumps

    records: list[Record | dict[str, Any]] = sorted([*journal.resumed_records(), *journal.resumed_fuzz()], key=_order)
    journal.reported = True
    note_dumps(config, dict.fromkeys(_nodeid(r).rpartition("::")[0] for r in records))  # under xdist: none collected
    session.testscollected += len(records) - journal.counted  # incomplete.py counted those it knew of
    hook, warning_as_error = config.hook, config.stash[SETTINGS_KEY].warning_as_error
    for record in records:
        nodeid, fuzz = _nodeid(record), None if isinstance(record, Record) else record["fuzz"]
        name, dump = nodeid.rpartition("::")[2], nodeid.rpartition("::")[0]
        location = (dump, 0, heading(config, dump, name, "msprobe fuzz" if fuzz else "msprobe"))
        outcome, longrepr, wasxfail = _outcome(record, warning_as_error, baseline.strict_xfail(config, nodeid)) \
            if isinstance(record, Record) else _fuzz_outcome(record["fuzz"], name)
        report = pytest.TestReport(nodeid, location, {"msprobe": 1, **({"fuzz": 1} if fuzz else {})}, outcome,
                                   longrepr, "call", user_properties=junit_properties(record)
                                   if isinstance(record, Record) else ())
        if not isinstance(record, Record):
            report.msprobe_fuzz = {**record["fuzz"], "nodeid": nodeid}  # type: ignore[attr-defined]  # triage
        else:
            report.msprobe = record  # type: ignore[attr-defined]
            if wasxfail is not None:
                report.wasxfail = wasxfail
        report.msprobe_resumed = True  # type: ignore[attr-defined]
        log_report(hook, report)
    return len(records)


Outcome = Literal["passed", "failed", "skipped"]


def _outcome(record: Record, warning_as_error: bool,
             xfail: tuple[str, str] | None) -> tuple[Outcome, Any, str | None]:
    """(outcome, longrepr, wasxfail) of a journaled record, as ApiItem.runtest and a strict baseline xfail
    ((reason, text once it passes)) give."""
    from ..reports.summary import skip_reason
    from .items import failure_text

    status = record.status
    if status == "SKIP":
        name = str(record.nodeid).rpartition("::")[2]
        return "skipped", (record.dump, 1, f"Skipped: {skip_reason(record, name)}"), None
    failed = status == "error" or (status == "Warning" and warning_as_error)
    if xfail is not None:
        return ("skipped", failure_text(record), xfail[0]) if failed else ("failed", xfail[1], None)
    return ("failed", failure_text(record), None) if failed else ("passed", None, None)


def _fuzz_outcome(result: dict[str, Any], name: str) -> tuple[Outcome, Any, None]:
    """(outcome, longrepr, None) of a journaled [fuzz] item, as FuzzItem.runtest gives."""
    from ..reports.summary import skip_message
    from .items import fuzz_failure_text

    if result.get("status") == "SKIP":
        return "skipped", (result.get("dump", ""), 1, f"Skipped: {skip_message(result.get('message'), name)}"), None
    if result.get("status") != "error":
        return "passed", None, None
    return "failed", fuzz_failure_text(result), None


def _order(record: Record | dict[str, Any]) -> tuple[str, int, bool, bool]:
    """Dump order: a dump's items as they ran, an entry's forward first, a [fuzz] item after its API's."""
    if isinstance(record, Record):
        return record.dump or "", record.order or 0, record.direction != "forward", False
    return record.get("dump", ""), record.get("order", 0), record.get("direction", "forward") != "forward", True


def _nodeid(record: Record | dict[str, Any]) -> str:
    return str(record.nodeid if isinstance(record, Record) else record["nodeid"])


def _is_fuzz(line: dict[str, Any]) -> bool:
    """A [fuzz] item's journal line: its result under "fuzz", not a record (whose `fuzz` is a flag)."""
    return isinstance(line.get("fuzz"), dict)


def _finished(line: dict[str, Any]) -> Record | dict[str, Any] | None:
    """A journal line as resuming keeps it: a [fuzz] item's line as it is, a record read once; None for a record
    this version cannot read (an older version's: its item runs again)."""
    if _is_fuzz(line):
        return line
    try:
        return Record.from_dict(line)
    except (ValueError, TypeError):  # TypeError: a value of another type (outputs that are not a list of objects)
        return None


def _plain(value: Any) -> Any:
    """numpy scalars and other stragglers of a fuzz result as JSON values."""
    return value.item() if hasattr(value, "item") else str(value)


def _fuzz_target(item: pytest.Item) -> str | None:
    """The API entry of an `<entry>[fuzz]` item (fuzz.FuzzItem, which imports this module), else None."""
    target = getattr(item, "target", None)
    return target if isinstance(target, str) and item.name.endswith("[fuzz]") else None


def final_records(*batches: list[Record]) -> list[Record]:
    """One record per node id (a later batch wins), in dump order: what the final files hold."""
    latest: dict[str, Record] = {}
    for batch in batches:
        for record in batch:
            latest[record.nodeid or f"{record.api}.{record.direction}"] = record
    return sorted(latest.values(), key=_order)


JOURNAL_KEY = pytest.StashKey[Journal]()
FINGERPRINT_KEY = pytest.StashKey[str]()


def configure(config: pytest.Config, settings: Settings) -> None:
    """Controller: open the journal (adopting its run seed when resuming without --msprobe-seed).
    Every collecting process with something to resume: the plugin that leaves finished items out."""
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


def item_key(item: pytest.Item, fingerprint: str | None = None) -> str:
    """An API item's entry_key; a [fuzz] item's is its API's, with the number of examples."""
    fingerprint = fingerprint or item_fingerprint(item.config)
    target = _fuzz_target(item)
    if target is not None:
        return entry_key(item.path, target, f"{fingerprint} fuzz {item.config.getoption('msprobe_fuzz')}")
    return entry_key(item.path, item.name, fingerprint, item.dump if isinstance(item, ApiItem) else None)


def item_fingerprint(config: pytest.Config) -> str:
    """run_fingerprint of this process's settings, computed once."""
    if FINGERPRINT_KEY not in config.stash:
        config.stash[FINGERPRINT_KEY] = run_fingerprint(config.stash[SETTINGS_KEY])
    return config.stash[FINGERPRINT_KEY]
