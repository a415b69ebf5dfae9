"""`--msprobe-fuzz N`: hypothesis draws around each forward call's recorded inputs.

One extra item per forward entry, `<dump.json>::<entry>[fuzz]` (stable, selectable, `-m fuzz`), placed
right after its API's item. It runs N examples; each example replaces every tensor input that has
numeric statistics by a drawn tensor and runs the item's whole check (device, bench, the selected
standard) on it, through a temporary `task: tensor` dump, so nothing about the check differs from
a real run. The first failing example is shrunk by hypothesis and reported; its repro script is
written (`--msprobe-repro DIR`, else `<--msprobe-out>/repro/`) and, with `--msprobe-save-error-data`,
its tensors are saved under `DIR[/<dump folder>]/fuzz/`.

The drawn tensors and the shrink past hypothesis: fuzz_inputs.py.

Seeds: example generation is seeded with `crc32("<run seed>:<entry>:fuzz")` (printed with the result;
hypothesis' database is off), so the same run seed reproduces the same examples, shrink and failure,
alone, under xdist, and whatever the rootdir and node id. The item runs with the run's torch thread
count, as API items do (devices.FirstItem), and its result is journaled (--msprobe-resume).

Ctrl-C: hypothesis turns a KeyboardInterrupt that lands in its own code (e.g. the final replay of the
failing example) into a reported error, and the run would go on; the item notes SIGINT itself and
raises KeyboardInterrupt whatever hypothesis made of it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..dump.reader import load_dump, parse_entry_name
from ..records.record import Record
from ..reports.summary import skip_message
from . import journal
from .fuzz_inputs import (  # noqa: F401  (re-exported: the fuzz API of tests and tools)
    MAX_SPECIALS,
    TENSOR_TYPES,
    TensorSpace,
    data_names,
    describe,
    isolate,
    leaf_where,
    materialize,
    replace_leaf,
    strategy,
    tensor_leaves,
    tensor_space,
)
from .items import FUZZ_SUFFIX, fuzz_failure_text, heading, rerun_command
from .stash import SETTINGS_KEY


def fuzz_seed(run_seed: int, entry_name: str) -> int:
    """Of the run seed and the entry only: the same wherever the dump lies and whatever the node id."""
    return zlib.crc32(f"{run_seed}:{entry_name}:fuzz".encode()) & 0x7FFFFFFF


@contextlib.contextmanager
def _noting_interrupts() -> Iterator[list[bool]]:
    """SIGINT still raises KeyboardInterrupt (the previous handler runs), and is noted in the list."""
    seen = [False]
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield seen  # ignored or default SIGINT: left as it is
        return

    def note(signum: int, frame: Any) -> None:
        seen[0] = True
        previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _global_constants_only() -> Iterator[None]:
    """Hypothesis mixes into its draws the constants of the "local" modules loaded so far (this package's
    too), and caches them per process: one seed drew other examples after a failure's triage had imported
    more. Here its draws use only its own built-in constants (internal API; left alone if it moved)."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants

        cache, original, empty = providers.CONSTANTS_CACHE, providers._get_local_constants, Constants()
    except (ImportError, AttributeError):
        yield
        return
    cache.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.cache.clear()


def extra_items(parent: pytest.Collector, item: pytest.Item) -> Iterator[pytest.Item]:
    """The `[fuzz]` item of a forward API item, when --msprobe-fuzz N > 0 (called by DumpFile.collect)."""
    if not parent.config.getoption("msprobe_fuzz", 0) or not item.name.endswith(".forward"):
        return
    fuzz = FuzzItem.from_parent(parent, name=f"{item.name}{FUZZ_SUFFIX}", target=item.name, order=getattr(item, "order", 0))
    for marker in item.iter_markers():
        fuzz.add_marker(marker.name)
    fuzz.add_marker("fuzz")
    yield fuzz


# ----------------------------------------------------------------------------- the item


class FuzzFound(Exception):
    """Raised inside the hypothesis test for a failing example."""


class FuzzItem(pytest.Item):
    def __init__(self, *, target: str, order: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target, self.order = target, order

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, heading(self.config, self.nodeid.rpartition("::")[0], self.target, "msprobe fuzz")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, FuzzFailed):
            return fuzz_failure_text(excinfo.value.result)
        return super().repr_failure(excinfo, style=style)

    def runtest(self) -> None:
        from .triage_hooks import FUZZ_RESULT_KEY

        with _noting_interrupts() as interrupted:
            try:
                result = self.fuzz()
            except BaseException:
                if interrupted[0]:  # whatever hypothesis made of it: stop the run, without its traceback
                    raise KeyboardInterrupt from None
                raise
        if interrupted[0]:  # swallowed by hypothesis
            raise KeyboardInterrupt
        result.update(item_id=journal.item_id(self.path, self.name), entry_key=journal.item_key(self),
                      order=self.order, dump=self.nodeid.rpartition("::")[0])  # what --msprobe-resume finds
        self.stash[FUZZ_RESULT_KEY] = result
        if result["status"] == "SKIP":  # -rs: at the dump, naming the item
            raise pytest.skip.Exception(skip_message(result["message"], self.name), _use_item_location=True)
        if result["status"] == "error":
            raise FuzzFailed(result)

    def rerun_command(self, n: int) -> str:
        return rerun_command(self.config, f"{self.path}::{self.name}", "--msprobe-fuzz", str(n))

    def fuzz(self) -> dict[str, Any]:
        """The hypothesis search over this call's inputs, in stages: the spaces its statistics allow, the search,
        and for a failing example its isolation and triage."""
        from ..specs.loader import load_specs

        settings = self.config.stash[SETTINGS_KEY]
        options = settings.check_options
        n = int(self.config.getoption("msprobe_fuzz"))
        seed = fuzz_seed(options.run_seed, self.target)
        result: dict[str, Any] = {"nodeid": self.nodeid, "api": self.target, "seed": seed, "examples": 0,
                                  "status": "pass", "message": "", "rerun": self.rerun_command(n)}
        dump = load_dump(self.path)
        entry = dump.entry(self.target)
        specs = load_specs(user_file=options.specs_file)
        if dump.task == "overflow_check" or dump.framework != "pytorch" or not isinstance(entry, dict):
            result.update(status="SKIP", message=f"{self.target}: fuzzing needs a PyTorch precision dump")
            return result
        spaces = _spaces(entry, parse_entry_name(self.target).api_name, specs)
        if not spaces:
            result.update(status="SKIP", message=f"{self.target}: no tensor input with statistics to fuzz")
            return result
        run = _example_runner(dump, self.target, entry, spaces, dataclasses.replace(options, data_mode="real"), specs)
        last = self._search(run, spaces, n, seed, result)
        if last:
            self._report_failure(run, spaces, last, result)
        return result

    def _search(self, run: Callable[[dict[str, Any]], Any], spaces: list[Any], n: int, seed: int,
                result: dict[str, Any]) -> dict[str, Any]:
        """Up to n examples, stopping at the first failing one (returned with its record; empty when none)."""
        import hypothesis
        from hypothesis import strategies as st

        from .triage_hooks import failed

        warning_as_error = self.config.stash[SETTINGS_KEY].warning_as_error
        last: dict[str, Any] = {}
        skipped = [0]

        @hypothesis.settings(max_examples=n, database=None, deadline=None, derandomize=False, print_blob=False,
                             report_multiple_bugs=False, suppress_health_check=list(hypothesis.HealthCheck),
                             phases=[hypothesis.Phase.generate, hypothesis.Phase.shrink])
        @hypothesis.seed(seed)
        @hypothesis.given(st.fixed_dictionaries({space.where: strategy(space) for _, _, space in spaces}))
        def prop(example: dict[str, Any]) -> None:
            result["examples"] += 1
            record, captured, example_dump = run(example)
            if record.status == "SKIP":
                skipped[0] += 1
            if failed(record, warning_as_error):
                last.update(example=example, record=record, captured=captured, dump=example_dump)
                raise FuzzFound(record.message or record.status)

        started = time.perf_counter()
        try:
            with _global_constants_only():
                prop()
        except FuzzFound:
            pass
        result["seconds"] = round(time.perf_counter() - started, 3)
        result["skipped_examples"] = skipped[0]
        if not last and skipped[0] == result["examples"]:
            result.update(status="SKIP", message=f"every fuzz example was skipped: {self.target}")
        return last

    def _report_failure(self, run: Callable[[dict[str, Any]], Any], spaces: list[Any], last: dict[str, Any],
                        result: dict[str, Any]) -> None:
        """The failing example isolated to the inputs that matter, shrunk into words, and triaged."""
        from .triage_hooks import TRIAGE_KEY, failed

        settings = self.config.stash[SETTINGS_KEY]
        space_list = [space for _, _, space in spaces]
        last.update(isolate(space_list, last, run, lambda rec: failed(rec, settings.warning_as_error)))
        record = last["record"]
        record.nodeid, record.dump, record.standard = self.nodeid, self.nodeid.split("::", 1)[0], settings.standard
        record.rerun, record.fuzz = result["rerun"], True
        shrunk = describe(space_list, last["example"])
        result.update(status="error", shrunk=shrunk, shrunk_text=shrunk.replace("\n", "; ")[:300],
                      message=record.message, record=record)
        captured = dict(last["captured"], dump=last["dump"], entry_name=self.target)
        self.config.stash[TRIAGE_KEY].after_failure(self, record, captured, fuzz=True)


def _spaces(entry: dict[str, Any], api: str, specs: dict[str, Any]) -> list[tuple[tuple[Any, ...], Any, Any]]:
    """Each tensor input with statistics, with the space its examples are drawn from."""
    from ..specs.loader import in_list

    spaces = []
    for path, leaf in tensor_leaves({"input_args": entry.get("input_args") or [],
                               "input_kwargs": entry.get("input_kwargs") or {}}, ()):
        clamp = path[:2] == ("input_args", 1) and in_list(specs, api, "preprocess", "clamp_min_zero_arg1")
        space = tensor_space(leaf_where(path), leaf, clamp)
        if space is not None:
            spaces.append((path, leaf, space))
    return spaces


def _example_runner(dump: Any, target: str, entry: dict[str, Any], spaces: list[Any], options: Any,
                    specs: dict[str, Any]) -> Callable[[dict[str, Any]], tuple[Record, dict[str, Any], Any]]:
    """One example checked as the call itself: its drawn tensors saved into a temporary dump beside the ones not
    fuzzed, and the entry checked there; (record, captured, example dump)."""
    def run(example: dict[str, Any]) -> tuple[Record, dict[str, Any], Any]:
        from ..check import check_entry
        from ..runs import capture
        from ..triage.errordata import temporary_dump

        args = entry.get("input_args") or []
        kwargs = entry.get("input_kwargs") or {}
        drawn = {}
        for i, (path, leaf, space) in enumerate(spaces):
            data_name = f"fuzz.{i}.pt"
            drawn[data_name] = materialize(space, example[space.where])
            if path[0] == "input_args":
                args = replace_leaf(args, path[1:], {**leaf, "data_name": data_name})
            else:
                kwargs = replace_leaf(kwargs, path[1:], {**leaf, "data_name": data_name})
        saved = {n: dump.tensor_dir / n for n in data_names([args, kwargs])  # tensors not fuzzed come along
                 if not n.startswith("fuzz.") and ".." not in Path(n).parts and (dump.tensor_dir / n).is_file()}
        new_entry = {**entry, "input_args": args, "input_kwargs": kwargs}
        with temporary_dump({target: new_entry}, drawn, saved, prefix="msprobe_fuzz_") as example_dump, \
                capture.capturing() as captured:
            record = check_entry(example_dump, target, options, specs)
        return record, captured, example_dump
    return run


class FuzzFailed(Exception):
    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("message", ""))
        self.result = result
