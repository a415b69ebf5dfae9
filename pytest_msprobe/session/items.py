"""pytest nodes: one item per recorded API call (the dump.json collector that makes them: collect.py).

Collection only parses JSON (no torch), so every xdist worker collects quickly; torch is
imported by the first item that runs.
"""
from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable

import pytest

from ..dump.reader import Dump, DumpError, EntryName, load_dump
from ..records.record import Record
from ..reports.summary import junit_properties, skip_reason
from . import ini_keys
from .stash import SETTINGS_KEY

RECORD_KEY = pytest.StashKey[Record]()
# (dump path, group key) -> the group's check record, per process
REUSE_KEY = pytest.StashKey[dict[tuple[Path, str], Record]]()
KNOWN_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                "int64", "uint64", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "int4")


FUZZ_SUFFIX = "[fuzz]"  # an API item's --msprobe-fuzz item is named <entry>[fuzz]


class ApiCheckFailed(Exception):
    """Raised by an item whose verdict is error (or Warning with --msprobe-warning-as-error)."""

    def __init__(self, record: Record) -> None:
        super().__init__(record.message)
        self.record = record


def dtype_marker(dtype: str) -> str:
    """torch.bfloat16 / BFloat16 -> bfloat16."""
    return dtype.rsplit(".", 1)[-1].lower()


def entry_markers(dump: Dump, entry_name: str, parsed: EntryName, with_dtypes: bool) -> list[str]:
    """An entry's own markers: its API type and direction, and (with_dtypes) every dtype recorded in the
    call's forward entry, from the dump's index; names that cannot be markers are left out."""
    markers = [parsed.api_type, parsed.direction]
    if with_dtypes:
        markers += [dtype_marker(d) for d in dump.dtypes(f"{parsed.full_name}.forward") or dump.dtypes(entry_name)]
    return [m for m in markers if m.isidentifier()]


class _Substrings:
    """-k's matcher: a word matches when it is a substring of one of the names (case-insensitive)."""

    def __init__(self, names: list[str]) -> None:
        self.names = [n.lower() for n in names]

    def __call__(self, word: str, /, **kwargs: str | int | bool | None) -> bool:
        word = word.lower()
        return not kwargs and any(word in n for n in self.names)


class _Markers:
    """-m's matcher: a marker name (dump items carry markers without arguments)."""

    def __init__(self, marks: list[str]) -> None:
        self.marks = set(marks)

    def __call__(self, name: str, /, **kwargs: str | int | bool | None) -> bool:
        return not kwargs and name in self.marks


def matcher(config: pytest.Config) -> Callable[[list[str], list[str]], bool] | None:
    """-k and -m as a test of (names, markers) of one item, or None without them or with an
    expression pytest itself will reject."""
    keyword, markexpr = (config.option.keyword or "").strip(), (config.option.markexpr or "").strip()
    if not (keyword or markexpr):
        return None
    try:
        from _pytest.mark.expression import Expression

        by_keyword = Expression.compile(keyword) if keyword else None
        by_mark = Expression.compile(markexpr) if markexpr else None
    except Exception:  # a bad expression: pytest reports it; an older pytest: nothing early
        return None

    def keep(names: list[str], markers: list[str]) -> bool:
        if by_keyword is not None and not by_keyword.evaluate(_Substrings([*names, *markers])):
            return False
        return by_mark is None or by_mark.evaluate(_Markers(markers))

    return keep


# node id path of each dump the run collected items from -> the label its items' headings carry (two or more dumps)
DUMP_LABELS_KEY = pytest.StashKey[dict[str, str]]()


def note_dumps(config: pytest.Config, dumps: Iterable[str]) -> None:
    """Add dumps (their node id paths) to those the run collected items from; with two or more, each item's
    failure heading carries its dump's folder past the folders they share (`step0/rank0`), as the CSV sets do."""
    from ..reports.results import dump_folders

    config.stash[DUMP_LABELS_KEY] = dump_folders([*config.stash.get(DUMP_LABELS_KEY, {}), *dumps])


def heading(config: pytest.Config, dump: str, name: str, kind: str = "msprobe") -> str:
    """An item's failure heading, `msprobe: <entry>`, or with several dumps `msprobe: <dump> <entry>`."""
    label = config.stash.get(DUMP_LABELS_KEY, {}).get(dump)
    return f"{kind}: {label} {name}" if label else f"{kind}: {name}"


def log_report(hook: Any, call: pytest.TestReport) -> None:
    """An item that did not run in this session's loop (a resumed result, a pool), reported through the hooks a
    run uses (terminal, short summary, JUnit, --lf cache, exit status): its start, a passed setup, `call`, a
    passed teardown and its finish."""
    nodeid, location = call.nodeid, call.location
    hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
    for when in ("setup", "call", "teardown"):
        hook.pytest_runtest_logreport(report=call if when == "call" else pytest.TestReport(
            nodeid, location, call.keywords, "passed", None, when))
    hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)


def failure_text(record: Record, rerun: str = "") -> str:
    """What a failed item prints: the failure table, after the traceback of an exception it raised (the table's
    one-line digest stays first: pytest's short summary shows a failure's first line). Also the text of a
    failure taken from the journal (--msprobe-resume)."""
    from ..reports.failure import format_failure

    text = format_failure(record, record.rerun or rerun)
    if record.traceback:
        digest, _, table = text.partition("\n")
        text = f"{digest}\n{record.traceback.rstrip()}\n\n{table}"
    return text


def rerun_command(config: pytest.Config, target: str, *extra: str, saved_data: bool = False) -> str:
    """The `rerun:` command of an item: its node, and every option that changes its verdict (seed, device,
    standard, modes, recording device, reference, specs, kernels, threads, NPU runtime, warning-as-error) and the plugins
    `-p` loaded (one may wrap the device call), so that it fails alone as it failed in the run. Like the
    record it belongs to, it does not depend on -n. The options' part is quoted once per process (the
    settings are fixed once configured). `saved_data`: the command that replays the run's saved error data
    (a tensor dump) the same way, so without a data mode, which would replace the saved tensors."""
    settings = config.stash[SETTINGS_KEY]
    options = config.stash.get(_RERUN_OPTIONS_KEY, None)
    if options is None or options[0] is not settings.check_options or options[1] != settings.warning_as_error:
        options = config.stash[_RERUN_OPTIONS_KEY] = (settings.check_options, settings.warning_as_error,
                                                      shlex.join(_rerun_options(config)),
                                                      shlex.join(_rerun_options(config, saved_data=True)))
    return " ".join(["pytest", shlex.quote(target), options[3] if saved_data else options[2], *map(shlex.quote, extra)])


_RERUN_OPTIONS_KEY = pytest.StashKey[tuple[Any, bool, str, str]]()


def _rerun_options(config: pytest.Config, saved_data: bool = False) -> list[str]:
    settings = config.stash[SETTINGS_KEY]
    opts = settings.check_options
    args = ["--msprobe-seed", str(opts.run_seed), "--msprobe-device", opts.device,
            "--msprobe-standard", opts.standard]
    data_mode = None if opts.data_mode == "auto" or saved_data else opts.data_mode
    for flag, value in (("msprobe_data_mode", data_mode),
                        ("--msprobe-mode", None if opts.mode == "auto" else opts.mode),
                        ("msprobe_recorded_on", None if opts.recorded_on == "auto" else opts.recorded_on),
                        ("--msprobe-contract", None if opts.contract == "auto" else opts.contract),
                        ("--msprobe-reference", opts.reference_device),
                        ("msprobe_reference_results", opts.reference_results),
                        ("msprobe_specs", opts.specs_file),
                        ("--msprobe-kernels", getattr(opts, "kernels", None)),
                        ("msprobe_threads", str(opts.threads) if opts.threads != 1 else None),
                        ("msprobe_bench_precision", None if opts.bench_precision == "auto" else opts.bench_precision),
                        ("msprobe_jit_compile", ini_keys.value(config, "msprobe_jit_compile")),
                        ("msprobe_allow_internal_format", ini_keys.value(config, "msprobe_allow_internal_format")),
                        ("msprobe_warning_as_error", settings.warning_as_error)):
        if value:  # an option, or an ini key (-o key=value)
            args += [flag, str(value)] if flag.startswith("-") else ini_keys.override(flag, value)
    for plugin in dict.fromkeys(config.getoption("plugins", None) or ()):  # -p NAME, in the order given
        if not plugin.startswith(("no:", "xdist")):  # not what -p no:... disables, nor -n's scheduler: same verdicts
            args += ["-p", plugin]
    return args


def fuzz_failure_text(result: dict[str, Any]) -> str:
    """What a failed `[fuzz]` item prints (fuzz.py), also when taken from the journal."""
    from ..reports.failure import format_failure

    record = result["record"]
    lines = [f"fuzzing {result['api']}: hypothesis found a failing input ({result['examples']} checks while "
             f"searching and shrinking, seed {result['seed']}); shrunk to:"]
    lines += ["  " + line for line in result["shrunk"].splitlines()]
    lines += ["", format_failure(record, result["rerun"])]
    if record.repro:
        lines.append(f"repro: python {record.repro}")
    return "\n".join(lines)


class ApiItem(pytest.Item):
    """One recorded API call in one direction; runs device and bench and applies the standard."""

    def __init__(self, *, order: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.order = order
        self.reuse: tuple[str, str] | None = None  # --msprobe-filter-api: (group key, representative entry)
        self.next_item: pytest.Item | None = None  # the item this process runs next, if known
        self.dump: Dump | None = None  # the dump as this item's check read it (the journal's key reads it too)

    def _check(self, entry_name: str) -> Record:
        from ..check import check_entry  # torch is imported here, never at collection
        from ..check.prepare import prefetch_later
        from ..runs.memory import hear_estimates, keep_freed_memory, release_freed_memory
        from ..specs.loader import load_specs
        from .inflight import Estimates, worker

        settings = self.config.stash[SETTINGS_KEY]
        options, me = settings.check_options, worker()
        estimates = Estimates(settings.out_dir, me, self.nodeid) if me is not None else None
        hear_estimates(estimates)  # a large check's estimate, for the crash report if this worker dies in it
        keep_freed_memory()
        try:
            # Once per item, before the helper thread gets the next item's inputs: each load_dump stats the
            # file, and a call that releases the GIL just after that hand-off waited 0.5-2 ms for it back.
            self.dump = dump = load_dump(self.path)
            specs = load_specs(user_file=options.specs_file)
            # handed over when this item's sides are made, just before its device run (check/prepare.py)
            prefetch_later(lambda: self._prefetch_next(options, specs, dump))
            return check_entry(dump, entry_name, options, specs)
        except ValueError as exc:  # unparseable entry name
            return Record(entry_name, "", 0, status="SKIP", message=str(exc))
        finally:
            prefetch_later(None)  # skipped before its runs: the next item builds its own inputs
            hear_estimates(None)
            if estimates is not None:
                estimates.close()
            release_freed_memory()  # the check's tensors are gone: their memory goes back to the OS

    def _prefetch_next(self, options: Any, specs: dict[str, Any], dump: Dump) -> None:
        """The next item's inputs are built in the helper thread while this item runs (check/prepare.py)."""
        from ..check.prepare import prefetch

        nxt = self.next_item
        if isinstance(nxt, ApiItem) and (nxt.reuse is None or nxt.reuse[1] == nxt.name):
            try:
                prefetch(dump if nxt.path == self.path else load_dump(nxt.path), nxt.name, options, specs)
            except DumpError:  # the next item reports it
                pass

    def _record(self) -> tuple[Record, str]:
        """(this item's record, the entry whose check produced it): its own check, or with
        --msprobe-filter-api the group's one check, made once per process (dedup.py)."""
        if self.reuse is None:
            return self._check(self.name), self.name
        key, representative = self.reuse
        done = self.config.stash.setdefault(REUSE_KEY, {})
        record = done.get((self.path, key))
        if record is None:
            record = done[(self.path, key)] = self._check(representative)
        if representative == self.name:
            return record.copy(), self.name
        from ..dump.dedup import reused_record

        return reused_record(record, representative, self.name), representative

    def runtest(self) -> None:
        settings = self.config.stash[SETTINGS_KEY]
        record, checked = self._record()
        record.nodeid, record.dump = self.nodeid, self.path.as_posix() if not self._relpath() else self._relpath()
        record.order, record.standard, record.rerun = self.order, settings.standard, self.rerun_command(checked)
        self.stash[RECORD_KEY] = record
        self.user_properties += junit_properties(record)  # JUnit <property> elements, also under xdist
        status = record.status
        if status == "SKIP":  # -rs: at the dump (not this line), the reason naming the entry
            raise pytest.skip.Exception(skip_reason(record, self.name), _use_item_location=True)
        if status == "error" or (status == "Warning" and settings.warning_as_error):
            raise ApiCheckFailed(record)

    def _relpath(self) -> str:
        return self.nodeid.split("::", 1)[0]

    def rerun_command(self, entry_name: str | None = None) -> str:
        return rerun_command(self.config, f"{self.path}::{entry_name or self.name}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ApiCheckFailed):
            return failure_text(excinfo.value.record, self.rerun_command())
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, heading(self.config, self._relpath(), self.name)
