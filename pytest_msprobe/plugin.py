"""pytest hooks of pytest-msprobe. Thin on purpose: the work lives in the modules it calls.

Nothing here imports torch, so loading the plugin (in every pytest run of the environment)
and collecting a dump stay cheap.
"""
from __future__ import annotations

import argparse
import os
import random
from pathlib import Path
from typing import Any, Generator

import pytest

from .items import KNOWN_DTYPES, KNOWN_TYPES, RECORD_KEY, ApiItem, DumpFile
from .settings import DATA_MODES, DEFAULT_SEED, DEVICES, SETTINGS_KEY, STANDARDS, CheckOptions, Settings

DUMP_BASENAME = "dump.json"


def _seed(value: str) -> int | str:
    if value == "random":
        return value
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--msprobe-seed wants an integer or 'random', got {value!r}") from None
    if not 0 <= seed < 2**32:
        raise argparse.ArgumentTypeError(f"--msprobe-seed must be in [0, 2**32), got {seed}")
    return seed


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("msprobe", "msprobe API precision checks (pytest-msprobe)")
    group.addoption("--msprobe-api-info", nargs="+", action="extend", default=[], metavar="DUMP_JSON",
                    help="msprobe dump.json file(s) to check; a dump.json given as a plain path works too")
    group.addoption("--msprobe-device", choices=DEVICES, default=None,
                    help="device under test: auto (npu if torch_npu imports, else cuda, else cpu), npu, cuda, cpu")
    group.addoption("--msprobe-seed", type=_seed, default=None,
                    help=f"run seed for random inputs (default {DEFAULT_SEED}; 'random' picks one and prints it)")
    group.addoption("--msprobe-data-mode", choices=DATA_MODES, default="auto",
                    help="auto: saved tensors when the dump has them, else random from statistics")
    group.addoption("--msprobe-standard", choices=STANDARDS, default="original",
                    help="precision standard (original: msprobe's cosine / max-abs / dual-ratio rules)")
    group.addoption("--msprobe-warning-as-error", action="store_true", default=False,
                    help="fail items whose verdict is msprobe's 'Warning'")
    group.addoption("--msprobe-out", default=None, metavar="DIR",
                    help="folder for the msprobe-compatible CSVs and the JSON lines records (default msprobe_results)")
    parser.addini("msprobe_device", "default for --msprobe-device", default="auto")
    parser.addini("msprobe_seed", "default for --msprobe-seed", default=str(DEFAULT_SEED))
    parser.addini("msprobe_out", "default for --msprobe-out", default="msprobe_results")
    parser.addini("msprobe_continue_on_collection_errors", type="bool", default=True,
                  help="a broken dump.json is reported as a collection error while the other dumps still run")


def _settings(config: pytest.Config) -> Settings:
    opt = config.option
    device = opt.msprobe_device or config.getini("msprobe_device")
    if device not in DEVICES:
        raise pytest.UsageError(f"ini msprobe_device: {device!r} is not one of {', '.join(DEVICES)}")
    seed: Any = opt.msprobe_seed if opt.msprobe_seed is not None else config.getini("msprobe_seed")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "msprobe_seed" in workerinput:
        seed = workerinput["msprobe_seed"]  # the controller's choice, identical on every worker
    elif seed == "random":
        seed = random.SystemRandom().randrange(2**31)
    else:
        try:
            seed = _seed(str(seed))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"ini msprobe_seed: {exc}") from None
    index = os.environ.get("PYTEST_MSPROBE_DEVICE_INDEX")
    options = CheckOptions(device=device, run_seed=int(seed), data_mode=opt.msprobe_data_mode,
                           device_index=int(index) if index else None)
    out = Path(opt.msprobe_out or config.getini("msprobe_out"))
    if not out.is_absolute():
        out = config.invocation_params.dir / out
    return Settings(check_options=options, standard=opt.msprobe_standard, warning_as_error=opt.msprobe_warning_as_error,
                    out_dir=out, api_info=[Path(p) for p in opt.msprobe_api_info])


def pytest_configure(config: pytest.Config) -> None:
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
    config.pluginmanager.register(ResultCollector(config), "msprobe-results")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "msprobe-xdist")


class XdistHooks:
    """Registered only when xdist is active: ships the run seed to every worker."""

    def pytest_configure_node(self, node: Any) -> None:
        settings = node.config.stash[SETTINGS_KEY]
        node.workerinput["msprobe_seed"] = settings.check_options.run_seed


def pytest_report_header(config: pytest.Config) -> str:
    settings = config.stash[SETTINGS_KEY]
    opts = settings.check_options
    return (f"msprobe: seed {opts.run_seed}, device {opts.device}, standard {settings.standard}, "
            f"data {opts.data_mode}, results -> {settings.out_dir}")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> DumpFile | None:
    if file_path.suffix != ".json":
        return None
    session = parent.session
    if session.isinitpath(file_path):
        return DumpFile.from_parent(parent, path=file_path)
    # A directory given on the command line: collect the dump.json files below it, but never
    # the ones that happen to sit under testpaths or the current directory.
    config = parent.config
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS or config.stash[SETTINGS_KEY].api_info
    if file_path.name == DUMP_BASENAME and explicit:
        return DumpFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if isinstance(item, ApiItem) and call.when == "call" and RECORD_KEY in item.stash:
        report.msprobe = item.stash[RECORD_KEY]  # travels to the xdist controller with the report
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
    record = getattr(report, "msprobe", None)
    if report.when == "call" and report.passed and record and record.get("status") == "Warning":
        return "warned", "W", ("WARNED", {"yellow": True})
    return None


class ResultCollector:
    """Gathers the records that arrive on reports; only the controller writes files."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[dict[str, Any]] = []
        self.written: dict[str, Path] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "msprobe", None)
        if record is not None and report.when == "call":
            self.records.append(record)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput") or not self.records:
            return
        from .report import write_results

        self.records.sort(key=lambda r: (r.get("dump", ""), r.get("order", 0), r.get("direction") != "forward"))
        self.written = write_results(self.records, self.config.stash[SETTINGS_KEY].out_dir)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.written:
            return
        from .report import summary_counts

        tr = terminalreporter
        tr.section("msprobe")
        counts = summary_counts(self.records)
        tr.write_line("items: " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts)))
        tr.write_line(f"seed: {self.config.stash[SETTINGS_KEY].check_options.run_seed}")
        for kind, path in self.written.items():
            tr.write_line(f"{kind}: {path}")
