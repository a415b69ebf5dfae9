"""From a red item to a fix: the pytest side of saved error data, repro scripts, fuzzing and
the HTML report. plugin.py only forwards `addoption` and `configure` here.

* In the process that runs an item (an xdist worker or the only process), a `pytest_runtest_call`
  wrapper opens a capture around the item's check (capture.py). When the item fails, that process
  writes the item's own files (tensors, repro script; unique names) and adds to the record what the
  controller needs: `error_data` (the dump entries), `repro` (the script) and `error_summary` (a few
  hundred numbers for the plots). The record travels on the report as always.
* The controller writes the shared files once at the end: every `dump.json` of the error data and
  the HTML page. Torch-free at import.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from ..records import wire
from ..records.record import Record
from .stash import SETTINGS_KEY

TRIAGE_KEY = pytest.StashKey["Triage"]()
FUZZ_REPORT_ATTR = wire.FUZZ_ATTR


def addoption(group: Any) -> None:
    group.addoption("--msprobe-save-error-data", default=None, nargs="?", const="", metavar="DIR",
                    help="save each failing item's inputs, device/bench outputs, cotangents and gradients as an "
                         "msprobe dump in DIR (the printed replay command replays them); without DIR: <error_data_path of "
                         "--msprobe-config, else .>/ut_error_data")
    group.addoption("--msprobe-repro", default=None, metavar="DIR",
                    help="write a Python script per failing item into DIR that reruns it with pytest-msprobe's check")
    group.addoption("--msprobe-fuzz", type=int, default=0, metavar="N",
                    help="add an item <entry>[fuzz] per forward API: N hypothesis draws of inputs within and at "
                         "the edges of the recorded statistics; a failure is shrunk and saved as a repro")
    group.addoption("--msprobe-html", default=None, metavar="FILE",
                    help="write one self-contained HTML report (sortable table, error plots of failing APIs)")


def configure(config: pytest.Config) -> None:
    opt = config.option
    if opt.msprobe_fuzz < 0:
        raise pytest.UsageError(f"--msprobe-fuzz wants a number of examples >= 0, got {opt.msprobe_fuzz}")
    if opt.msprobe_fuzz and importlib.util.find_spec("hypothesis") is None:
        raise pytest.UsageError("--msprobe-fuzz needs hypothesis: pip install 'pytest-msprobe[fuzz]' (or hypothesis)")
    config.addinivalue_line("markers", "fuzz: an <entry>[fuzz] item of --msprobe-fuzz")
    here = config.invocation_params.dir
    save = opt.msprobe_save_error_data
    if save == "":  # given without a folder: msprobe's error_data_path
        from .msprobe_config import error_data_dir

        save = str(error_data_dir(config))
    elif save and save.endswith(".json") and (here / save).is_file():
        raise pytest.UsageError(f"--msprobe-save-error-data takes a folder, got the file {save}; write "
                                f"--msprobe-save-error-data=DIR {save}, or put the option after the dump")
    save_dir, repro_dir, html_file = (None if not p else (here / p).resolve() for p in (
        save, opt.msprobe_repro, opt.msprobe_html))
    triage = Triage(config, save_dir, repro_dir, html_file, opt.msprobe_fuzz)
    config.stash[TRIAGE_KEY] = triage
    config.pluginmanager.register(triage, "msprobe-triage")


def failed(record: Record, warning_as_error: bool) -> bool:
    status = record.status
    return status == "error" or (status == "Warning" and warning_as_error)


class Triage:
    def __init__(self, config: pytest.Config, save_dir: Path | None, repro_dir: Path | None,
                 html_file: Path | None, fuzz: int) -> None:
        self.config = config
        self.save_dir, self.repro_dir, self.html_file, self.fuzz = save_dir, repro_dir, html_file, fuzz
        self.flat = True  # one source dump: DIR/dump.json; several: DIR/<dump folder>/dump.json
        self.fuzz_results: list[dict[str, Any]] = []
        self.records: list[Record] = []
        self.written: dict[str, Any] = {}
        self.pytest_html = config.pluginmanager.hasplugin("html") and bool(getattr(config.option, "htmlpath", None))

    # ------------------------------------------------------------------ in the process running items

    @property
    def capturing(self) -> bool:
        return bool(self.save_dir or self.repro_dir or self.html_file or self.pytest_html)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # the dumps items came from: every item made from a dump carries the `msprobe` marker (API items
        # get it at collection, --msprobe-fuzz items copy their API item's markers)
        self.flat = len({str(item.path) for item in session.items if item.get_closest_marker("msprobe")}) <= 1 and \
            not self.config.pluginmanager.has_plugin("msprobe-online")  # its items come later, a dump per rank/step

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        from .items import RECORD_KEY, ApiItem

        if not isinstance(item, ApiItem) or not self.capturing:
            return (yield)
        from ..runs import capture

        with capture.capturing() as captured:
            try:
                return (yield)
            finally:
                record = item.stash.get(RECORD_KEY, None)
                if record is not None:
                    self.after_failure(item, record, captured)

    def after_failure(self, item: Any, record: Record, captured: dict[str, Any],
                      fuzz: bool = False) -> None:
        """Write a failing item's own files and put what the controller needs on its record."""
        settings = item.config.stash[SETTINGS_KEY]
        if not failed(record, settings.warning_as_error) or not captured:
            return
        from ..triage import errordata

        dump_rel = item.nodeid.split("::", 1)[0]
        key = errordata.dump_key(dump_rel)
        steps: list[tuple[str, Callable[[], None]]] = []
        if self.save_dir:
            folder = errordata.target_dir(self.save_dir, key, self.flat, fuzz)
            steps.append(("--msprobe-save-error-data", lambda: self._save(item, record, captured, folder)))
        precision = captured.get("mode") != "overflow_check"  # overflow triage: no precision metrics to replay
        repro_dir = self.repro_dir or (settings.out_dir / "repro" if fuzz else None)
        if repro_dir and precision:
            steps.append(("--msprobe-repro", lambda: self._repro(item, record, captured, repro_dir)))
        if (self.html_file or self.pytest_html) and precision:
            steps.append(("--msprobe-html", lambda: self._summary(record, captured, settings.check_options)))
        for option, step in steps:
            try:
                step()
            except Exception as exc:  # a tool must never turn a result into a crash
                record.notes.append(f"{option} could not write this item: "
                                                      f"{type(exc).__name__}: {exc}")

    def _save(self, item: Any, record: Record, captured: dict[str, Any], folder: Path) -> None:
        from ..dump.reader import load_dump
        from ..triage.errordata import save_item

        dump = captured.get("dump") or load_dump(item.path)
        saved = save_item(dump, captured.get("entry_name", item.name), captured, folder, record)
        if saved is not None:
            saved["dir"] = Path(os.path.relpath(folder, self.save_dir)).as_posix()
            record.error_data = saved

    def _repro(self, item: Any, record: Record, captured: dict[str, Any], folder: Path) -> None:
        from ..dump.reader import load_dump
        from ..triage.repro import RedItem, write_script

        settings = item.config.stash[SETTINGS_KEY]
        if captured.get("framework") or captured.get("mode") == "replay":
            # a recorded or MindSpore device side: the call's script reads it from its dump
            from ..triage.repro import script_name
            from ..triage.script import write

            script: Path | None = write(f"{item.path}::{item.name}", folder / script_name(item.nodeid), settings.check_options)
        else:
            dump = captured.get("dump") or load_dump(item.path)
            red = RedItem(dump, captured.get("entry_name", item.name), item.nodeid, captured, record)
            script = write_script(folder, red, settings.check_options)
        if script is not None:
            record.repro = str(script)

    @staticmethod
    def _summary(record: Record, captured: dict[str, Any], options: Any) -> None:
        from ..dump.reader import parse_entry_name
        from ..specs.loader import load_specs
        from ..triage.error_summary import gross_limit, summarize

        if "compared_device" in captured:
            specs = load_specs(user_file=options.specs_file)
            api = parse_entry_name(f"{record.api}.{record.direction}").api_name
            record.error_summary = summarize(captured["compared_bench"], captured["compared_device"],
                                             [o.name for o in record.outputs],
                                                lambda dtype: gross_limit(specs, api, dtype))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        if call.when != "call":
            return report
        fuzz = item.stash.get(FUZZ_RESULT_KEY, None)
        if fuzz is not None:
            setattr(report, FUZZ_REPORT_ATTR, fuzz)
        from .items import RECORD_KEY

        record = fuzz.get("record") if fuzz else item.stash.get(RECORD_KEY, None)
        if record and report.failed:
            if record.repro:
                report.sections.append(("msprobe repro", f"python {shlex.quote(record.repro)}"))
            if record.error_data:
                report.sections.append(("msprobe error data", f"saved in {self.save_dir / record.error_data['dir']} "
                                                              f"(replay: {self.replay_command()})"))
            if self.pytest_html and record.error_summary:
                self._html_extra(report, record)
        return report

    def replay_command(self) -> str:
        """The command that replays every saved failure as it failed: on the saved tensors, with the options of
        the `rerun:` line (they decide the device side and the verdict: a substituted kernel, a replay of the
        recorded outputs, the standard). Without them a tensor dump is checked on the default device and standard."""
        from .items import rerun_command

        assert self.save_dir is not None
        return rerun_command(self.config, str(self.save_dir), saved_data=True)

    @staticmethod
    def _html_extra(report: pytest.TestReport, record: Record) -> None:
        try:
            from pytest_html import extras
        except ImportError:
            return
        from ..triage.html import plots_html

        found = list(getattr(report, "extras", []))
        found.append(extras.html(plots_html(record)))
        report.extras = found  # type: ignore[attr-defined]  # pytest-html's extras attribute

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(self, config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
        data = yield
        if data is not None:
            wire.plain_records(data)  # its record in the JSON form (the plugin's wrapper may come after this one)
        if data is not None and isinstance(data.get(FUZZ_REPORT_ATTR), dict):  # crosses execnet as one string
            data[FUZZ_REPORT_ATTR] = json.dumps(data[FUZZ_REPORT_ATTR], default=_plain)
        return data

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(self, config: pytest.Config, data: dict[str, Any]) -> Generator[None, Any, Any]:
        report = yield
        if isinstance(getattr(report, FUZZ_REPORT_ATTR, None), str):
            setattr(report, FUZZ_REPORT_ATTR, json.loads(getattr(report, FUZZ_REPORT_ATTR)))
        wire.typed_records(report)
        return report

    # ------------------------------------------------------------------ controller

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        fuzz = getattr(report, FUZZ_REPORT_ATTR, None)
        if fuzz is not None:
            self.fuzz_results.append(fuzz)
        record = getattr(report, "msprobe", None)
        if record is not None:
            self.records.append(record)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput") or self.config.option.collectonly:
            return
        collector = self.config.pluginmanager.get_plugin("msprobe-results")
        records = list(getattr(collector, "records", None) or self.records)  # resumed records included
        if self.save_dir:
            from ..triage.errordata import write_dumps

            saved = [r for r in records if r.error_data]
            saved += [f["record"] for f in self.fuzz_results if f.get("record") and f["record"].error_data]
            if saved:
                self.written["error_data"] = write_dumps(self.save_dir, saved)
        if self.html_file:
            from ..triage.html import write_html

            settings = self.config.stash[SETTINGS_KEY]
            write_html(self.html_file, records, self.fuzz_results, settings)
            self.written["html"] = self.html_file

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        lines = []
        if self.written.get("error_data"):
            dumps = self.written["error_data"]
            lines.append(f"error data: {len(dumps)} dump(s) in {self.save_dir} (replay: {self.replay_command()})")
        repros = [r.repro for r in self.records if r.repro]
        repros += [f["record"].repro for f in self.fuzz_results if f.get("record") and f["record"].repro]
        if repros:
            lines.append(f"repro scripts: {len(repros)}, e.g. python {shlex.quote(repros[0])}")
        if self.fuzz_results:
            bad = [f for f in self.fuzz_results if f.get("status") == "error"]
            lines.append(f"fuzz: {len(self.fuzz_results)} API(s), {self.fuzz} examples each, {len(bad)} failing; "
                         f"seeds from run seed {self.config.stash[SETTINGS_KEY].check_options.run_seed}")
            for f in bad[:10]:
                lines.append(f"  {f['nodeid']}  seed {f['seed']}: {f.get('shrunk_text', '')}".rstrip())
        if self.written.get("html"):
            lines.append(f"html report: {self.written['html']}")
        if lines:
            terminalreporter.section("msprobe triage")
            for line in lines:
                terminalreporter.write_line(line)


FUZZ_RESULT_KEY = pytest.StashKey[dict[str, Any]]()


def _plain(value: Any) -> Any:
    """numpy scalars and other stragglers as JSON values."""
    return value.item() if hasattr(value, "item") else str(value)
