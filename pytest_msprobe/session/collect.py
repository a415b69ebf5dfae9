"""The dump.json collector: one ApiItem per forward and backward entry, their markers, early -k/-m
selection for large dumps, and the `[fuzz]` items of --msprobe-fuzz right after their API.

Node ids: a dump under the rootdir is its path from there, as pytest does; a dump outside it gets its
absolute path (pytest would give it an empty path, or one relative to the argument, which two such
dumps share). `--lf` and the short summary (relative to the working directory) read it as a path.
A collection error reads `ERROR <dump> - <reason>` (also without xdist), and a directory argument that yields nothing and
holds no dump.json and no Python test file is reported as a collection error (it was silently ignored).

Collection only parses JSON (no torch), so every xdist worker collects quickly.
"""
from __future__ import annotations

import fnmatch
import functools
import types
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from ..dump.reader import KNOWN_TYPES, Dump, DumpError, load_dump, parse_entry_name
from .items import KNOWN_DTYPES, ApiItem, entry_markers, matcher, note_dumps
from .stash import SETTINGS_KEY


def _want_dtype_markers(config: pytest.Config) -> bool:
    """dtype markers cost a walk over every entry; by default only when -m or -k could use them."""
    setting: str = config.getini("msprobe_dtype_markers")
    if setting == "auto":
        return bool(config.option.markexpr or config.option.keyword)
    return setting == "always"


# Plugins whose pytest_collection_modifyitems neither adds markers nor keywords to dump items: with only
# these, -k/-m can be applied while a dump is collected (pytest applies them again afterwards).
# (xdist's worker code runs as execnet's `__channelexec__` module; its hook only renames loadgroup items.)
_SELECTION_SAFE = ("_pytest.", "xdist.", "__channelexec__", "pytest_msprobe.", "_hypothesis_pytestplugin",
                   "pytest_randomly")


def _selection(collector: pytest.Collector) -> Callable[[str, list[str]], bool] | None:
    """A test of (entry name, its marker names) that is true for every item -k and -m keep, or None.

    It gives each entry exactly the names pytest's -k matches (the item's and its parents' names, its
    markers) and -m's markers. Only when no other plugin or conftest modifies items after collection
    (one could add a marker that -k or -m selects)."""
    config = collector.config
    match = matcher(config)
    if match is None:
        return None
    for impl in config.pluginmanager.hook.pytest_collection_modifyitems.get_hookimpls():
        plugin = impl.plugin
        module = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
        if not str(module).startswith(_SELECTION_SAFE):
            return None
    chain = collector.listchain()
    parents = [node.name for node in chain if not isinstance(node, pytest.Session)
               and not (isinstance(node, pytest.Directory) and isinstance(node.parent, pytest.Session))]
    parents += [k for node in chain for k in node.extra_keyword_matches]
    parent_marks = [m.name for node in chain for m in node.own_markers]

    def keep(entry_name: str, markers: list[str]) -> bool:
        return match([*parents, entry_name], [*markers, *parent_marks])

    return keep


@functools.cache
def _mark(name: str) -> pytest.Mark:
    return pytest.Mark(name, (), {}, _ispytest=True)


def path_id(config: pytest.Config, path: Path) -> str:
    """The node id path of a dump or folder: from the rootdir, or absolute when outside it."""
    try:
        return path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return Path(path).absolute().as_posix()


class DumpFile(pytest.File):
    """A dump.json: one item per forward entry and one per backward entry."""

    @classmethod
    def for_path(cls, parent: pytest.Collector, path: Path) -> DumpFile:
        return cls.from_parent(parent, path=path, nodeid=path_id(parent.config, path))

    def collect(self) -> Iterator[pytest.Item]:
        try:
            dump = load_dump(self.path)
        except DumpError as exc:
            raise self.CollectError(str(exc)) from None
        config = self.config
        registered = set(KNOWN_TYPES + KNOWN_DTYPES)
        with_dtypes = _want_dtype_markers(config)
        fuzz_items: Callable[[pytest.Collector, pytest.Item], Iterator[pytest.Item]] | None = None
        if config.getoption("msprobe_fuzz", 0):
            from .fuzz import extra_items  # only then: its drawing code is 10-20 ms of every process's start-up

            fuzz_items = extra_items
        grouping: dict[str, tuple[str, str]] = {}
        if config.stash[SETTINGS_KEY].filter_api:
            from ..dump.dedup import groups

            grouping = groups(dump, dump.entry_names())
        # Large dumps only: items -k/-m drop are then never made, so pytest's summary does not count them as
        # deselected; small dumps keep pytest's own accounting.
        large = len(dump.entry_names()) >= int(config.getini("msprobe_early_selection_entries"))
        selected = None if fuzz_items is not None or not large else _selection(self)
        msprobe = _mark("msprobe")
        for order, entry_name in enumerate(dump.entry_names()):
            try:
                parsed = parse_entry_name(entry_name)
            except ValueError:
                parsed = None
            markers = [] if parsed is None else entry_markers(dump, entry_name, parsed, with_dtypes)
            for marker in markers:
                if marker not in registered:
                    config.addinivalue_line("markers", f"{marker}: msprobe API type or dtype")
                    registered.add(marker)
            if selected is not None and not selected(entry_name, ["msprobe", *markers]):
                continue  # -k/-m would deselect it: not even made (a 200k-entry dump, 20 items picked)
            item = ApiItem.from_parent(self, name=entry_name, order=order)
            item.reuse = grouping.get(entry_name)
            # Marks are attached directly (add_marker costs ~50 us per call, 400k calls for a big dump);
            # -m and -k both read own_markers.
            item.own_markers += [msprobe, *(_mark(m) for m in markers)]
            yield item
            if fuzz_items is not None:
                yield from fuzz_items(self, item)  # --msprobe-fuzz: <entry>[fuzz] right after its API

    @property
    def dump(self) -> Dump:
        return load_dump(self.path)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    """A broken dump's one-line reason as a plain string, so the short summary shows it as well."""
    report = yield
    if isinstance(collector, DumpFile) and report.failed and not hasattr(report.longrepr, "reprcrash"):
        report.longrepr = str(report.longrepr).strip()
    return report


def empty_folders(config: pytest.Config, items: list[pytest.Item]) -> list[Path]:
    """Folder arguments of the command line that yielded no item and hold neither a dump.json nor a
    Python test file (those keep pytest's own "no tests ran")."""
    here = config.invocation_params.dir
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return []
    found = {item.path for item in items}
    patterns = config.getini("python_files")
    empty = []
    for arg in dict.fromkeys(config.args):
        path = (here / arg.split("::", 1)[0]).resolve()
        if not path.is_dir() or any(path in p.parents for p in found):
            continue
        if next(path.rglob("dump.json"), None) is None and not any(
                fnmatch.fnmatch(f.name, pattern) for f in path.rglob("*.py") for pattern in patterns):
            empty.append(path)
    return empty


class EmptyFolders:
    """Each process that collects reports such folders as collection errors (xdist shows one of each), and notes
    the dumps it collected items from (failure headings name the dump when there are several)."""

    @pytest.hookimpl(tryfirst=True)  # before -k/-m, resume and shards drop items
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        note_dumps(config, dict.fromkeys(item.parent.nodeid for item in items if isinstance(item.parent, DumpFile)))
        for path in empty_folders(config, items):
            report = pytest.CollectReport(path_id(config, path), "failed", result=[], longrepr=(
                "no dump.json in this folder argument (it collects the dump.json files below it) and no test file"))
            config.hook.pytest_collectreport(report=report)


def keep_cache_here(config: pytest.Config) -> None:
    """Without a config file pytest takes the common folder of the arguments and the working directory as rootdir
    (for a dump given by path from elsewhere, that folder or, when the two share only /, the dump's own folder: often
    shared or read-only storage) and writes .pytest_cache there: keep the cache in the folder the command runs in. A cache_dir the user set (ini, -o, tox) is left alone. Before the
    cacheprovider's pytest_configure reads it (pytest_load_initial_conftests)."""
    here, root = config.invocation_params.dir, config.rootpath
    if config.inipath is not None or here == root or not config.pluginmanager.has_plugin("cacheprovider"):
        return  # (-p no:cacheprovider: no cache, and no cache_dir ini key to read)
    if config.getini("cache_dir") != ".pytest_cache":
        return
    config._inicache["cache_dir"] = str(here / ".pytest_cache")  # getini's cache: what the cacheprovider reads
