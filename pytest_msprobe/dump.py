"""Reading msprobe dump.json files of every version into compact per-call records.

Collection runs in every xdist worker, so this module is torch-free and parses each file once
per process; items keep only entry names and look the raw entry up when they run.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

DIRECTIONS = ("forward", "backward")
# Types whose entries describe modules/cells, not API calls (L0 / mix dumps).
_MODULE_MARKERS = ("Module", "Cell")
_NAME_OK = re.compile(r"^[A-Za-z0-9_.\-]+$")


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


@dataclass
class Dump:
    """One parsed dump.json: header fields plus the raw `data` mapping."""

    path: Path
    task: str | None
    level: str | None
    framework: str
    dump_data_dir: str | None
    data: dict[str, Any]
    ignored_modules: int = 0
    _names: list[str] = field(default_factory=list)

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
        return self.data.get(name)

    def counterpart(self, name: EntryName, direction: str) -> Any:
        return self.data.get(f"{name.full_name}.{direction}")


def _infer_framework(header: dict[str, Any], data: dict[str, Any]) -> str:
    framework = header.get("framework")
    if isinstance(framework, str) and framework:
        lowered = framework.lower()
        if lowered in ("pt", "pytorch"):
            return "pytorch"
        if lowered in ("ms", "mindspore"):
            return "mindspore"
        return lowered
    # 1.0.x dumps have no framework key: the type/dtype strings tell.
    for name, entry in data.items():
        if name.startswith(("Mint", "Primitive", "Cell")):
            return "mindspore"
        for leaf in iter_leaves(entry):
            if isinstance(leaf, dict):
                type_str = str(leaf.get("type", ""))
                if type_str.startswith("torch"):
                    return "pytorch"
                if type_str.startswith("mindspore"):
                    return "mindspore"
    return "pytorch"


def iter_leaves(value: Any, depth: int = 0) -> Iterator[Any]:
    """Yield argument encodings (dicts with a `type`), None and scalars, depth-first."""
    if depth > 64:
        return
    if isinstance(value, list):
        for item in value:
            yield from iter_leaves(item, depth + 1)
    elif isinstance(value, dict):
        if "type" in value or "class_type" in value or not value:
            yield value
        else:
            for item in value.values():
                yield from iter_leaves(item, depth + 1)
    else:
        yield value


_CACHE: dict[tuple[str, int, int], Dump] = {}


def load_dump(path: os.PathLike[str] | str) -> Dump:
    """Parse a dump.json once per process; every problem raises DumpError naming the file."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise DumpError(f"{path}: cannot read dump file ({exc.strerror})") from exc
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    try:
        with open(path, "rb") as fh, _gc_paused():
            raw = json.load(fh)  # accepts NaN / Infinity / -Infinity as msprobe writes them
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
    if not isinstance(raw, dict):
        raise DumpError(f"{path}: top level is a {type(raw).__name__}, expected an object with a 'data' key")
    if "data" not in raw:
        raise DumpError(f"{path}: no 'data' key; this is not an msprobe dump.json")
    data = raw["data"]
    if not isinstance(data, dict):
        raise DumpError(f"{path}: 'data' is a {type(data).__name__}, expected an object of entries")
    dump = Dump(
        path=path,
        task=raw.get("task") if isinstance(raw.get("task"), str) else None,
        level=raw.get("level") if isinstance(raw.get("level"), str) else None,
        framework=_infer_framework(raw, data),
        dump_data_dir=raw.get("dump_data_dir") if isinstance(raw.get("dump_data_dir"), str) else None,
        data=data,
    )
    for name in data:
        if is_module_entry(name):
            dump.ignored_modules += 1
        else:
            dump._names.append(name)
    _CACHE[key] = dump
    # The parsed dump lives for the whole session: keep the collector from re-scanning millions of
    # its dicts and lists on every collection (pytest gc.collect()s several times at exit).
    gc.freeze()
    return dump


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
