"""pytest hooks of pytest-msprobe. Thin on purpose: the work lives in the modules it calls.

Nothing here imports torch, so loading the plugin (in every pytest run of the environment)
and collecting a dump stay cheap.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from .dump.reader import KNOWN_TYPES
from .records import wire
from .records.record import Record
from .reports import summary
from .session import (
    baseline,
    collect,
    device_hooks,
    devices,
    guard,
    incomplete,
    ini_keys,
    journal,
    kernel_selection,
    msprobe_config,
    npu_options,
    online_setup,
    pooled,
    result_files,
    shard,
    terminal,
    workers,
)
from .session import triage_hooks as triage
from .session.collect import DumpFile
from .session.items import KNOWN_DTYPES, RECORD_KEY, ApiItem, note_dumps
from .session.options import addoption as add_options
from .session.options import parse_seed
from .session.stash import SETTINGS_KEY
from .settings import (
    CONTRACTS,
    STANDARDS,
    CheckOptions,
    Settings,
    parse_bytes,
)

DUMP_BASENAME = "dump.json"
REFERENCE_ONLY = "reference-only"  # pytest outcome category of passing reference-vs-reference items
PREINDEX_MAX = 256  # dump.json files below a folder argument the xdist controller indexes for the workers


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)  # session/options.py


def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    collect.keep_cache_here(early_config)  # not in a dump's folder, pytest's rootdir without a config file


def _settings(config: pytest.Config) -> Settings:
    opt = config.option
    device = device_hooks.check_name(config, opt.msprobe_device or config.getini("msprobe_device"),
                                 "--msprobe-device" if opt.msprobe_device else "ini msprobe_device")
    seed: Any = opt.msprobe_seed if opt.msprobe_seed is not None else config.getini("msprobe_seed")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "msprobe_seed" in workerinput:
        seed = workerinput["msprobe_seed"]  # the controller's choice, identical on every worker
    elif seed == "random":
        seed = random.SystemRandom().randrange(2**31)
    else:
        try:
            seed = parse_seed(str(seed))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini msprobe_seed: {exc}") from None
    standard = opt.msprobe_standard or config.getini("msprobe_standard")
    if standard not in STANDARDS:
        raise pytest.UsageError(f"ini msprobe_standard: {standard!r} is not one of {', '.join(STANDARDS)}")
    recorded_on = ini_keys.value(config, "msprobe_recorded_on")
    checks_on = ini_keys.value(config, "msprobe_checks_on")
    contract = opt.msprobe_contract or config.getini("msprobe_contract")
    if contract not in CONTRACTS:
        raise pytest.UsageError(f"ini msprobe_contract: {contract!r} is not one of {', '.join(CONTRACTS)}")
    bench_device = device_hooks.bench_device_of(ini_keys.value(config, "msprobe_bench_device") or "",
                                                ini_keys.where(config, "msprobe_bench_device"))
    max_memory = None
    memory = opt.msprobe_max_memory or config.getini("msprobe_max_memory")
    if memory:
        try:
            max_memory = parse_bytes(str(memory))
        except ValueError as exc:
            where = "--msprobe-max-memory" if opt.msprobe_max_memory else "ini msprobe_max_memory"
            raise pytest.UsageError(f"{where}: {exc}") from None
    here = config.invocation_params.dir
    specs_file = ini_keys.value(config, "msprobe_specs")
    if specs_file:
        specs_file = str(here / specs_file)
        from .specs.loader import SpecError, load_specs

        try:
            load_specs(user_file=specs_file)  # reject a bad file before anything runs
        except SpecError as exc:
            raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_specs')}: {exc}") from None
    reference_results = ini_keys.value(config, "msprobe_reference_results")
    if reference_results:
        reference_results = str(here / reference_results)
        if not Path(reference_results).is_file():
            raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_reference_results')}: no such file: "
                                    f"{reference_results}")
    if opt.msprobe_reference:
        device_hooks.check_name(config, opt.msprobe_reference, "--msprobe-reference", allow_auto=False)
    threads = devices.threads(config)
    data_mode = ini_keys.value(config, "msprobe_data_mode")
    options = CheckOptions(device=device, run_seed=int(seed), data_mode=data_mode,
                           device_index=devices.device_index(config), threads=threads,
                           work_threads=devices.work_threads(threads, config),
                           standard=standard,
                           reference_device=opt.msprobe_reference, reference_results=reference_results,
                           specs_file=specs_file, kernels=kernel_selection.configure(config), mode=opt.msprobe_mode,
                           bench_precision=ini_keys.value(config, "msprobe_bench_precision"), recorded_on=recorded_on,
                           checks_on=checks_on, contract=contract, bench_device=bench_device,
                           max_memory=max_memory)
    if opt.msprobe_mode == "replay" and data_mode == "random":
        raise pytest.UsageError("--msprobe-mode replay compares the recorded outputs, which belong to the recorded "
                                "inputs: it cannot use msprobe_data_mode random")
    out = Path(opt.msprobe_out or config.getini("msprobe_out"))
    if not out.is_absolute():
        out = here / out
    return Settings(check_options=options, standard=standard,
                    warning_as_error=ini_keys.value(config, "msprobe_warning_as_error"), out_dir=out,
                    api_info=[Path(p) for p in opt.msprobe_api_info],
                    filter_api=ini_keys.value(config, "msprobe_filter_api"))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, on the controller (xdist workers get the same arguments)
        for line in ini_keys.deprecations(config):
            sys.stderr.write(line + "\n")
    settings = _settings(config)
    config.stash[SETTINGS_KEY] = settings
    config.addinivalue_line("markers", "msprobe: an API call replayed from an msprobe dump")
    for name in KNOWN_TYPES + KNOWN_DTYPES + ("forward", "backward"):
        config.addinivalue_line("markers", f"{name}: msprobe API type, dtype or direction")
    if settings.api_info:
        missing = [str(p) for p in settings.api_info if not p.exists()]
        if missing:
            raise pytest.UsageError(f"--msprobe-api-info: no such file: {', '.join(missing)}")
        paths = [str(p) for p in settings.api_info]
        if config.args_source == pytest.Config.ArgsSource.ARGS:
            config.args.extend(paths)
        else:  # only the dumps, not testpaths or the current directory
            config.args[:] = paths
    if config.getini("msprobe_continue_on_collection_errors"):
        config.option.continue_on_collection_errors = True
    workers.adapt(config)  # before xdist's own pytest_configure (trylast) starts a distributed session
    journal.configure(config, settings)  # first: resuming may adopt the journal's run seed
    msprobe_config.configure(config)  # before triage: its error_data_path
    online_setup.configure(config)  # after msprobe_config: an is_online run_ut section
    npu_options.configure(config)
    devices.configure(config, settings)
    guard.configure(config, settings.check_options.run_seed)
    shard.configure(config)
    baseline.configure(config)
    triage.configure(config)
    config.pluginmanager.register(ResultCollector(config, result_files.keep_runs(config)), "msprobe-results")
    if journal.JOURNAL_KEY in config.stash and not config.pluginmanager.hasplugin("msprobe-online"):  # offline controller
        config.pluginmanager.register(incomplete.Completeness(config, config.stash[journal.JOURNAL_KEY]),
                                      incomplete.PLUGIN_NAME)
    config.pluginmanager.register(collect, "msprobe-collect")  # collection errors, empty folder arguments
    config.pluginmanager.register(collect.EmptyFolders(), "msprobe-empty-folders")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "msprobe-xdist")


class XdistHooks:
    """Registered only when xdist is active: ships the run seed to every worker, indexes the dumps
    before the workers start (they load the index instead of parsing), schedules by cost, and says why the
    first results are long in coming on a machine's first run (the workers compile the checks)."""

    waiting: terminal.Notice | None = None

    def pytest_configure_node(self, node: Any) -> None:
        settings = node.config.stash[SETTINGS_KEY]
        node.workerinput["msprobe_seed"] = settings.check_options.run_seed

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = session.config
        if hasattr(config, "workerinput") or not getattr(config.option, "tx", None):
            return
        self.waiting = terminal.Notice(config, *terminal.warm_up_notice(workers=True))
        from .dump.reader import DumpError, load_dump

        here = config.invocation_params.dir
        columns = ("work", "dtypes") if config.option.keyword or config.option.markexpr else ("work",)
        for arg in dict.fromkeys(config.args):
            path = here / arg.split("::", 1)[0]
            explicit = config.args_source == pytest.Config.ArgsSource.ARGS  # not testpaths or "."
            found = [path] if path.suffix == ".json" and path.is_file() else \
                sorted(path.rglob(DUMP_BASENAME))[:PREINDEX_MAX] if explicit and path.is_dir() else []
            for dump in found:
                try:  # writes the index the workers load (dumpindex.py), with what they will need
                    load_dump(dump, columns)
                except DumpError:
                    pass  # every worker reports it as a collection error

    def pytest_runtest_logreport(self) -> None:
        self._stop_waiting()  # a first result has come

    def pytest_sessionfinish(self) -> None:
        self._stop_waiting()

    def _stop_waiting(self) -> None:
        if self.waiting is not None:
            self.waiting.cancel()
            self.waiting = None

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        completeness = node.config.pluginmanager.get_plugin(incomplete.PLUGIN_NAME)
        if completeness is not None:
            completeness.collection_finished(ids)
        resuming = node.config.stash.get(journal.JOURNAL_KEY, None)
        if resuming is not None and resuming.resume:  # the headings of resumed items name their dump as the workers do
            note_dumps(node.config, dict.fromkeys(nodeid.split("::", 1)[0] for nodeid in ids))

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "load" or _schedule(config) != "cost":
            return None
        from .session.schedule import CostScheduling

        return CostScheduling(config, log, filter_api=config.stash[SETTINGS_KEY].filter_api)


def _schedule(config: pytest.Config) -> str:
    return str(ini_keys.value(config, "msprobe_schedule"))


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = config.stash[SETTINGS_KEY]
    opts = settings.check_options
    npu = npu_options.header(config)
    return [f"msprobe: seed {opts.run_seed}, device {opts.device}, standard {settings.standard}, "
            f"data {opts.data_mode}, mode {opts.mode}, results -> {settings.out_dir}", *terminal.header_lines(config),
            *([npu] if npu else [])]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Items live until the session ends: move them out of the cyclic collector's way (a 100k-item
    dump otherwise costs seconds in the gc.collect() calls pytest makes at exit)."""
    gc.freeze()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> DumpFile | None:
    if file_path.suffix != ".json":
        return None
    session = parent.session
    if session.isinitpath(file_path):
        return DumpFile.for_path(parent, file_path)
    # A directory given on the command line: collect the dump.json files below it, but never
    # the ones that happen to sit under testpaths or the current directory.
    config = parent.config
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS or config.stash[SETTINGS_KEY].api_info
    if file_path.name == DUMP_BASENAME and explicit:
        return DumpFile.for_path(parent, file_path)
    return None


_WARMED: list[str] = []  # the standards this process has warmed up for


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if isinstance(item, ApiItem):
        item.next_item = nextitem  # its inputs are built while this item's API runs
        standard = item.config.stash[SETTINGS_KEY].standard
        if standard not in _WARMED:
            with devices.long_lived(), terminal.notice_if_slow(item.config, *terminal.warm_up_notice(workers=False)):
                from .check.compare import warm_up  # torch: at the first item, not at plugin load
                from .runs.memory import keep_freed_memory

                keep_freed_memory()  # before any helper thread allocates: one heap for all threads
                warm_up(standard)  # the compiled checks, outside the item's timeout
            _WARMED.append(standard)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if isinstance(item, ApiItem) and call.when == "call":
        record = item.stash.get(RECORD_KEY, None)
        if record is None and (record := guard.record_for_exception(item, call, report)) is not None:
            report.user_properties += summary.junit_properties(record)
        if record is not None:
            record.item_id = journal.item_id(item.path, item.name)  # what --msprobe-resume finds ...
            record.entry_key = journal.item_key(item)  # ... and checks
            report.msprobe = record  # travels to the xdist controller with the report
    return report


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
    data = yield
    if data is None:
        return data
    wire.plain_records(data)  # a record crosses the wire in its JSON form
    if hasattr(config, "workerinput"):  # to the xdist controller: one JSON string (wire.py)
        packed = wire.pack(data)
        if packed is not data:
            return packed
    if isinstance(data.get("msprobe"), dict):  # one string crosses execnet several
        data["msprobe"] = json.dumps(data["msprobe"])  # times cheaper than nested objects
    return data


@pytest.hookimpl(wrapper=True)
def pytest_report_from_serializable(config: pytest.Config, data: dict[str, Any]) -> Generator[None, Any, Any]:
    unpacked = wire.unpack(data)
    if unpacked is not None:  # a worker's packed report: pytest builds it from the original dict
        data.clear()
        data.update(unpacked)
    report = yield
    if isinstance(getattr(report, "msprobe", None), str):
        report.msprobe = json.loads(report.msprobe)
    wire.typed_records(report)
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
    record = getattr(report, "msprobe", None)
    if report.when != "call" or not record:
        return None
    if report.failed and record.reference_only:
        return "failed", "F", ("FAILED (reference only)", {"red": True})
    if report.passed and record.reference_only:  # an NPU op run as its bench on both sides: not counted as passed
        word = "WARNED" if record.status == "Warning" else "PASSED"
        return REFERENCE_ONLY, "r", (f"{word} (reference only)", {"yellow": True})
    reused = " (reused)" if record.reused_from else ""  # msprobe_filter_api
    if report.passed and record.status == "Warning":
        return "warned", "W", (f"WARNED{reused}", {"yellow": True})
    if reused and not hasattr(report, "wasxfail"):
        return report.outcome, {"passed": ".", "failed": "F", "skipped": "s"}[report.outcome], \
            (f"{report.outcome.upper()}{reused}", {"green": report.passed, "red": report.failed,
                                                   "yellow": report.skipped})
    return None


class ResultCollector:
    """Gathers the records that arrive on reports; only the controller writes files."""

    def __init__(self, config: pytest.Config, keep_runs: int) -> None:
        self.config, self.keep_runs = config, keep_runs
        self.sets: str | None = None  # what msprobe_keep_runs kept and removed
        self.records: list[Record] = []
        self.written: dict[str, Path] = {}
        self.removed: list[Path] = []
        self.journal = config.stash.get(journal.JOURNAL_KEY, None)  # controller only
        self.resumed = self.known = 0
        self.fuzz_counts: dict[str, int] = {}  # status -> [fuzz] items
        self.nothing_checked: str | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "msprobe", None)
        resumed = getattr(report, "msprobe_resumed", False)
        if record is not None:  # on call reports, and on xdist's report of a crashed item
            self.records.append(record)
            self.known += hasattr(report, "wasxfail") and report.skipped
            self.resumed += resumed
            if self.journal is not None and not resumed:
                self.journal.write(record)
        elif report.when == "call" and "fuzz" in report.keywords and "msprobe" in report.keywords:  # [fuzz] items
            status = {"passed": "pass", "failed": "error"}.get(report.outcome, "SKIP")
            self.fuzz_counts[status] = self.fuzz_counts.get(status, 0) + 1
            self.resumed += resumed
            fuzz = getattr(report, triage.FUZZ_REPORT_ATTR, None)
            if self.journal is not None and not resumed and isinstance(fuzz, dict) and fuzz.get("entry_key"):
                self.journal.write({k: fuzz.get(k) for k in ("nodeid", "item_id", "entry_key", "order", "dump")}
                                   | {"fuzz": wire.plain_fuzz(fuzz)})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, Any]:
        result = yield
        if self.journal is None or self.config.option.collectonly:
            return result
        if self.journal.resumed:
            journal.report_resumed(self.config, session, self.journal)
        self.records += pooled.report(self.config, session, self.records)  # after every call, resumed ones too
        allowed = ini_keys.value(self.config, "msprobe_allow_all_skipped")
        self.nothing_checked = None if allowed else summary.nothing_checked(self.records)
        if self.nothing_checked:
            session.testsfailed += 1  # exit status 1: a gate that checked nothing is not green
        return result

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.journal is None or self.config.option.collectonly:
            return
        unreported = [] if self.journal.reported else self.journal.resumed_records()  # e.g. after Ctrl-C
        if self.records or unreported:
            from .reports.results import write_results

            self.records = journal.final_records(unreported, self.records)
            self.written = write_results(self.records, self.config.stash[SETTINGS_KEY].out_dir)
            self.removed = self.journal.supersede(self.written)
            self.sets = result_files.prune(self.config.stash[SETTINGS_KEY].out_dir, self.keep_runs)
        self.journal.close()

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int) -> None:
        completeness = self.config.pluginmanager.get_plugin(incomplete.PLUGIN_NAME)
        unfinished = completeness.lines(exitstatus) if completeness is not None else []
        if not self.written and not unfinished:
            return
        terminalreporter.section("msprobe")
        lines = terminal.terminal_lines(self.config, self.records, self.written, self.resumed, self.known,
                                        self.fuzz_counts) if self.written else []
        if lines and completeness is not None and unfinished:
            lines[0] += f"; {completeness.never_ran()} never ran"
        for line in lines:
            terminalreporter.write_line(line)
        for line in summary.warned_lines(self.records, every="p" in terminalreporter.reportchars):
            terminalreporter.write_line(line)
        if self.removed:
            terminalreporter.write_line(f"removed {len(self.removed)} file(s) of an earlier run, superseded by "
                                        f"these: {', '.join(p.name for p in self.removed)}")
        if self.sets:
            terminalreporter.write_line(self.sets)
        if self.nothing_checked:
            terminalreporter.write_line(self.nothing_checked, red=True, bold=True)
        for line in unfinished:
            terminalreporter.write_line(line, red=True, bold=True)
