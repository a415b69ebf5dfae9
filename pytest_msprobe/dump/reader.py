"""Reading msprobe dump.json files of every version into compact per-call records.

Collection runs in every xdist worker, so this module is torch-free and indexes each file once
per process (dumpindex.py: a cached index makes that milliseconds); items keep only entry names and
read their raw entry from the file when they run.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import index as dumpindex
from .index import Index, iter_leaves, tensor_bytes

__all__ = ["DIRECTIONS", "Dump", "DumpError", "EntryName", "forget_dumps", "is_module_entry", "iter_leaves",
           "load_dump", "parse_entry_name", "resolve_tensor_path"]

DIRECTIONS = ("forward", "backward")
# Types whose entries describe modules/cells, not API calls (L0 / mix dumps).
_MODULE_MARKERS = ("Module", "Cell")
_NAME_OK = re.compile(r"^[A-Za-z0-9_.\-]+$")

# msprobe's API types (the first part of an entry name)
KNOWN_TYPES = ("Functional", "Tensor", "Torch", "NPU", "Aten", "VF", "Distributed", "MindSpeed", "Triton",
               "Mint", "MintFunctional", "MintDistributed", "Primitive", "Jit")


class DumpError(Exception):
    """A dump file that cannot be used at all (becomes a collection error naming the file)."""


@dataclass(frozen=True)
class EntryName:
    """`Type.api_name.index.direction`, where api_name may hold one dot (`linalg.vector_norm`)."""

    api_type: str
    api_name: str
    index: str
    direction: str

    @property
    def full_name(self) -> str:
        return f"{self.api_type}.{self.api_name}.{self.index}"


def parse_entry_name(name: str) -> EntryName:
    """Split an L1 entry name; raises ValueError with the reason when it is not one."""
    if not _NAME_OK.match(name):
        raise ValueError(f"entry name {name!r} has characters msprobe never writes")
    parts = name.split(".")
    direction = parts[-1]
    if direction not in DIRECTIONS:
        raise ValueError(f"entry name {name!r} does not end in .forward or .backward")
    body = parts[:-1]
    if len(body) == 3:
        api_type, api_name, index = body
    elif len(body) == 4:
        api_type, api_name, index = body[0], f"{body[1]}.{body[2]}", body[3]
    else:
        raise ValueError(f"entry name {name!r} does not have the form Type.api.index.direction")
    if not index.isdigit():
        raise ValueError(f"entry name {name!r}: call index {index!r} is not a number")
    return EntryName(api_type, api_name, index, direction)


def is_module_entry(name: str) -> bool:
    first = name.split(".", 1)[0]
    return any(marker in first for marker in _MODULE_MARKERS) or ".parameters_grad" in name


class Dump:
    """One dump.json: header fields, API entry names, and each entry read from the file on demand
    (dumpindex.py): a process never holds the whole parsed dump."""

    def __init__(self, path: Path, index: Index, stat: os.stat_result) -> None:
        self.path, self._stat = path, stat
        header = index.header
        self.task = header.get("task") if isinstance(header.get("task"), str) else None
        self.level = header.get("level") if isinstance(header.get("level"), str) else None
        self.framework = _framework(header)
        data_dir = header.get("dump_data_dir")
        self.dump_data_dir = data_dir if isinstance(data_dir, str) else None
        self._index = index
        self._fd: int | None = None
        self._position = {name: k for k, name in enumerate(index.names)}
        self._names = [name for name in index.names if not is_module_entry(name)]
        self.ignored_modules = len(index.names) - len(self._names)
        self._recent: OrderedDict[str, Any] = OrderedDict()
        self._largest: int | None = None
        self.held: dict[str, Any] = {}  # data_name -> a tensor given with the dump instead of its file (an
        # in-process call's, handed to the worker in memory); read before the file, see inputs/build.load_saved

    @property
    def tensor_dir(self) -> Path:
        """msprobe resolves tensors beside dump.json, so moved dumps keep working."""
        return self.path.parent / "dump_tensor_data"

    @property
    def is_real_data(self) -> bool:
        return bool(self.dump_data_dir) or self.task == "tensor"

    def entry_names(self) -> list[str]:
        """API entry names in dump order (modules/cells left out)."""
        return self._names

    def entry(self, name: str) -> Any:
        """The parsed entry (None if absent); the last few are kept, as an item reads its entries often."""
        entry = self._recent.get(name)
        if entry is not None:
            self._recent.move_to_end(name)
            return entry
        k = self._position.get(name)
        if k is None:
            return None
        try:
            entry = _entry_loads(self._read(k))
        except (ValueError, OSError):
            raise DumpError(f"{self.path}: entry {name} cannot be read: the file changed during the run") from None
        self._recent[name] = entry
        if len(self._recent) > _RECENT:
            self._recent.popitem(last=False)
        return entry

    def _file(self) -> int:
        """An open descriptor of the file; at most _OPEN_FILES dumps keep one open at a time."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        _OPEN.pop(id(self), None)
        _OPEN[id(self)] = self
        while len(_OPEN) > _OPEN_FILES:
            _, oldest = _OPEN.popitem(last=False)
            oldest.close()
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def work(self, name: str) -> float | None:
        """The work estimate of an entry's call (dumpindex.work)."""
        k = self._position.get(name)
        if k is None:
            return None
        return self.with_columns("work").work[k]  # type: ignore[index]

    def dtypes(self, name: str) -> list[str]:
        """The dtype strings recorded in an entry, in first-seen order."""
        k = self._position.get(name)
        if k is None:
            return []
        text = self.with_columns("dtypes").dtypes[k]  # type: ignore[index]
        return text.split(",") if text else []

    def with_columns(self, *columns: str) -> Index:
        """The index, with these per-entry columns computed (once, from the file) if it lacked them; the
        cached index is updated for the next process."""
        if self._index.fill(columns, self._read):
            dumpindex.store(self.path, self._stat, self._index)
        return self._index

    def _read(self, k: int) -> bytes:
        start, end = self._index.offsets[2 * k], self._index.offsets[2 * k + 1]
        return os.pread(self._file(), end - start, start)

    def largest_call(self) -> int:
        """Bytes of the tensors of the dump's largest call (its forward's inputs and outputs and its backward's
        gradients, in and out), from their recorded shapes and dtypes; every entry is read once, on first use."""
        if self._largest is None:
            calls: dict[str, int] = {}
            for name in self._names:
                call = name.rsplit(".", 1)[0]
                try:
                    size = tensor_bytes(_entry_loads(self._read(self._position[name])))
                except (ValueError, OSError):
                    size = 0  # an entry that cannot be read fails its own item, with the reason
                calls[call] = calls.get(call, 0) + size
            self._largest = max(calls.values(), default=0)
        return self._largest

    def counterpart(self, name: EntryName, direction: str) -> Any:
        return self.entry(f"{name.full_name}.{direction}")


def _framework(header: dict[str, Any]) -> str:
    framework = header.get("framework")
    if isinstance(framework, str) and framework:
        lowered = framework.lower()
        if lowered in ("pt", "pytorch"):
            return "pytorch"
        if lowered in ("ms", "mindspore"):
            return "mindspore"
        return lowered
    return str(header.get("inferred_framework") or "pytorch")  # 1.0.x dumps: from names and type strings


_CACHE: dict[tuple[str, int, int], Dump] = {}
_RECENT = 64  # parsed entries kept per dump
_ENTRY_LIMIT = 3000  # the recursion limit an entry's parse runs under (Python's default: 1000)


def _entry_loads(raw: str | bytes) -> Any:
    """json.loads of an entry the collector has parsed already: an item calls it from a deeper stack (pytest,
    xdist, the item's stages), so an entry nested close to the parser's limit gets more room than it had there
    (its nesting is then judged as an argument, in one line)."""
    if sys.getrecursionlimit() < _ENTRY_LIMIT:
        sys.setrecursionlimit(_ENTRY_LIMIT)  # only ever raised: other threads may be parsing
    return json.loads(raw)


_OPEN: OrderedDict[int, Dump] = OrderedDict()  # dumps holding an open descriptor, least recent first
_OPEN_FILES = 16


def load_dump(path: os.PathLike[str] | str, columns: tuple[str, ...] = ()) -> Dump:
    """Index a dump.json once per process (or load its cached index); every problem raises DumpError
    naming the file. `columns` (dumpindex.COLUMNS) are computed while scanning, cheaper than later."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise DumpError(f"{path}: cannot read dump file ({exc.strerror})") from exc
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    index = dumpindex.load_cached(path, stat)
    if index is None:
        index = _scan(path, stat, columns)
        dumpindex.store(path, stat, index)
    dump = _CACHE[key] = Dump(path, index, stat)
    if columns:
        dump.with_columns(*columns)
    return dump


def forget_dumps(folder: Path) -> None:
    """Drop the cached dumps under a folder about to be removed (a temporary one-call dump): the next folder
    at that path, of the same size and time, is another dump."""
    for key in [k for k in _CACHE if k[0].startswith(str(folder.resolve()))]:
        del _CACHE[key]


def _scan(path: Path, stat: os.stat_result, columns: tuple[str, ...]) -> Index:
    try:
        with open(path, "rb") as fh, _gc_paused():
            text = fh.read()
            if not text.strip():  # not "truncated JSON": nothing was written (a dumping run stopped at its start)
                raise DumpError(f"{path}: the file is empty ({len(text)} bytes)")
            index = dumpindex.scan(text, columns)
    except json.JSONDecodeError as exc:
        hint = " (the file looks truncated)" if exc.pos >= stat.st_size - 2 else ""
        raise DumpError(
            f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}"
        ) from exc
    except UnicodeDecodeError as exc:
        raise DumpError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except RecursionError:
        raise DumpError(f"{path}: arrays or objects nested deeper than Python's JSON parser allows (about "
                        f"{sys.getrecursionlimit()} levels); msprobe never writes such a file") from None
    except ValueError as exc:  # valid JSON Python refuses, e.g. an integer of more than 4300 digits
        raise DumpError(f"{path}: {exc}") from None
    except OSError as exc:
        raise DumpError(f"{path}: cannot read dump file ({exc.strerror})") from exc
    except dumpindex.IndexError_:
        top = json.loads(path.read_bytes())
        raise DumpError(f"{path}: top level is a {type(top).__name__}, expected an object with a 'data' key") from None
    if not index.has_data:
        raise DumpError(f"{path}: no 'data' key; this is not an msprobe dump.json")
    if index.data_type != "dict":
        raise DumpError(f"{path}: 'data' is a {index.data_type}, expected an object of entries")
    return index


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """json builds millions of containers; cyclic GC passes over them only slow the parse down."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def resolve_tensor_path(dump: Dump, leaf: dict[str, Any]) -> Path | None:
    """The saved tensor file of an argument, refusing anything outside dump_tensor_data/.

    Legacy dumps record an absolute `datapath` from the dump host; only its file name is
    looked up locally, so a copied dump works and no path can escape the dump folder.
    """
    name = leaf.get("datapath") or leaf.get("data_name")
    if not name:
        return None
    if not isinstance(name, str):
        raise ValueError(f"data_name {name!r} is not a string")
    if leaf.get("datapath"):
        name = os.path.basename(name)
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts or name.startswith(("/", "\\")):
        raise ValueError(f"data_name {name!r} points outside the dump folder")
    base = dump.tensor_dir.resolve()
    target = (dump.tensor_dir / rel).resolve()
    if base != target and base not in target.parents:
        raise ValueError(f"data_name {name!r} resolves to {target}, outside {base} (symlink?)")
    return target
