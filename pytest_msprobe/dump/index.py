"""An index of a dump.json: entry names, where each entry sits in the file, and what collection needs.

Every process that collects a dump (each xdist worker, every rerun) used to parse the whole JSON and
keep it: 2-3 s and ~450 MB for 100,000 entries, per process. The index is one scan of the file (the
JSON decoder's own C scanner, entry by entry) that keeps, per entry, its byte range, a work
estimate from its input shapes (the cost that orders, schedules and shards items) and its dtypes (the -m/-k
markers), and drops the parsed values. Items read their own entry from the file when they run.

A large dump's index is also written to a per-user cache folder, keyed by the file's path, size and
modification time, so the next process (an xdist worker, a rerun) loads it in milliseconds instead of
scanning; the xdist controller builds it before it starts the workers. Torch-free and pytest-free.
"""
from __future__ import annotations

import array
import hashlib
import json
import marshal
import math
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]  # the C scanner json itself uses
from pathlib import Path
from typing import Any, Callable

VERSION = 3
CACHE_MIN_BYTES = 4 << 20  # smaller dumps scan in well under 0.1 s: not worth a file
CACHE_ENV = "PYTEST_MSPROBE_INDEX_DIR"
_WS = re.compile(r"[ \t\n\r]*")
_DTYPE = re.compile(r'"dtype"\s*:\s*"([^"\\]+)"')
_HEADER_KEYS = ("task", "level", "framework", "dump_data_dir")


class IndexError_(ValueError):
    """The file is not a dump.json the index can describe (the caller words the message)."""


COLUMNS = ("work", "dtypes")  # per-entry facts computed when a process first needs them


@dataclass
class Index:
    header: dict[str, Any]         # task, level, framework (inferred when absent), dump_data_dir
    names: list[str]               # every key of `data`, in file order
    offsets: array.array[int]      # byte start and end of each entry's value: 2 per name
    work: array.array[float] | None = None  # each entry's work estimate (`work`), element-equivalents
    dtypes: list[str] | None = None  # comma-joined dtype strings recorded in each entry
    has_data: bool = True          # False: no "data" key (the caller reports it)
    data_type: str = "dict"        # the JSON type of "data" when it is not an object

    def to_bytes(self) -> bytes:
        return marshal.dumps((VERSION, self.header, self.names, self.offsets.tobytes(),
                              None if self.work is None else self.work.tobytes(), self.dtypes))

    @classmethod
    def from_bytes(cls, blob: bytes) -> Index:
        version, header, names, offsets, work, dtypes = marshal.loads(blob)
        if version != VERSION:
            raise ValueError(f"index version {version}")
        off = array.array("q")
        off.frombytes(offsets)
        num = None
        if work is not None:
            num = array.array("d")
            num.frombytes(work)
        if len(off) != 2 * len(names) or (num is not None and len(num) != len(names)) or (
                dtypes is not None and len(dtypes) != len(names)):
            raise ValueError("inconsistent index")
        return cls(header, names, off, num, dtypes)

    def fill(self, columns: tuple[str, ...], read: Callable[[int], bytes]) -> bool:
        """Compute the missing `columns` from each entry's bytes (`read(k)`); True if any was missing."""
        work_missing, dtypes_missing = "work" in columns and self.work is None, "dtypes" in columns and \
            self.dtypes is None
        if not (work_missing or dtypes_missing):
            return False
        works, dtypes = array.array("d"), []
        for k, name in enumerate(self.names):
            raw = read(k)
            if work_missing:
                works.append(work(_api_name(name), json.loads(raw)))
            if dtypes_missing:
                dtypes.append(entry_dtypes(raw.decode("utf-8")))
        if work_missing:
            self.work = works
        if dtypes_missing:
            self.dtypes = dtypes
        return True


def entry_dtypes(text: str) -> str:
    """The dtype strings recorded in an entry's JSON text, comma-joined in first-seen order."""
    return ",".join(dict.fromkeys(_DTYPE.findall(text)))


# Work estimate of a call, in element-equivalents: the elements of its input tensors (input generation,
# copies and comparison scale with them) plus, for the matmul and convolution family, its multiply-adds
# weighted by FLOP_WEIGHT (a matmul costs far more than its inputs suggest; one multiply-add is cheaper
# than the per-element work of the check). Used to run expensive items first and to balance shards.
FLOP_WEIGHT = 1 / 16
_MATMUL = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "einsum",
                     "npu_linear", "npu_mm_all_reduce_base", "npu_grouped_matmul"})
_CONV = ("conv", "conv_transpose")
_ATTENTION = frozenset({"scaled_dot_product_attention", "npu_fusion_attention", "npu_prompt_flash_attention",
                        "npu_incre_flash_attention"})


def _shapes(value: Any) -> list[list[int]]:
    """Tensor shapes in argument order (a tight loop: it runs for every entry of a dump)."""
    out: list[list[int]] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is list:
            stack.extend(reversed(v))
        elif type(v) is dict:
            if "type" in v:
                shape = v.get("shape")
                if type(shape) is list and all(type(d) is int and d >= 0 for d in shape):
                    out.append(shape)
            else:
                stack.extend(reversed(list(v.values())))
    return out


def work(api_name: str, entry: Any) -> float:
    """Element-equivalents of one forward call (see FLOP_WEIGHT)."""
    if not isinstance(entry, dict):
        return 0.0
    shapes = _shapes([entry.get("input_args"), entry.get("input_kwargs")])
    numel = sum(map(math.prod, shapes))
    macs = 0
    if api_name not in _MATMUL and api_name not in _ATTENTION and not api_name.startswith(_CONV):
        return float(numel)
    tensors = [s for s in shapes if len(s) >= 1]
    if api_name in _MATMUL and len(tensors) >= 2:
        if api_name in ("linear", "npu_linear"):  # x (..., K), weight (N, K)
            x, weight = tensors[0], tensors[1]
            macs = math.prod(x) * (weight[0] if len(weight) == 2 else 1)
        else:  # the last two tensors: (..., M, K) @ (..., K, N)
            a, b = tensors[-2], tensors[-1]
            macs = math.prod(a) * (b[-1] if len(b) >= 2 else 1)
    elif api_name.startswith(_CONV) and len(tensors) >= 2:
        weight = tensors[1]
        out = _shapes(entry.get("output"))
        if out and len(weight) >= 3:
            macs = math.prod(out[0]) * math.prod(weight[1:])
    elif api_name in _ATTENTION and len(tensors) >= 2:
        q, k = tensors[0], tensors[1]
        if len(k) >= 2:
            macs = 2 * math.prod(q) * k[-2]
    return float(numel + macs * FLOP_WEIGHT)


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


_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "bfloat16": 2, "float16": 2,
             "half": 2, "int16": 2, "float32": 4, "float": 4, "int32": 4, "int": 4, "float64": 8, "double": 8,
             "int64": 8, "long": 8, "complex64": 8, "complex128": 16}


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors recorded in an entry's value, from their shapes and dtypes (4 per element where the
    dtype is not one known here: torch's and MindSpore's spellings are)."""
    total = 0
    for leaf in iter_leaves(value):
        shape = leaf.get("shape") if isinstance(leaf, dict) else None
        if isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape):
            dtype = str(leaf.get("dtype", "")).rsplit(".", 1)[-1].lower()
            total += math.prod(shape) * _ITEMSIZE.get(dtype, 4)
    return total


class _Framework:
    """msprobe 1.0.x dumps have no framework key: the first decisive name or type string tells."""

    def __init__(self) -> None:
        self.guess: str | None = None

    def see(self, name: str, entry: Any) -> None:
        if self.guess is not None:
            return
        if name.startswith(("Mint", "Primitive", "Cell")):
            self.guess = "mindspore"
            return
        for leaf in iter_leaves(entry):
            type_str = str(leaf.get("type", "")) if isinstance(leaf, dict) else ""
            if type_str.startswith("torch"):
                self.guess = "pytorch"
                return
            if type_str.startswith("mindspore"):
                self.guess = "mindspore"
                return


def scan(raw: bytes, columns: tuple[str, ...] = ()) -> Index:
    """Index the bytes of a dump.json, with the COLUMNS asked for; raises ValueError (json's, with line
    and column) when it is not valid JSON, IndexError_ for valid JSON that is not an object."""
    text = raw.decode("utf-8")
    try:
        return _scan(text, len(text) != len(raw), "work" in columns, "dtypes" in columns)
    except (ValueError, StopIteration, IndexError):
        top = json.loads(text)  # raises json's own error, with its line and column, for invalid JSON
        kind = type(top).__name__.replace("dict", "object").replace("NoneType", "null")
        raise IndexError_(f"top level is a {kind}, expected an object" if not isinstance(top, dict)
                          else "not an object") from None  # valid JSON, but not {"data": {...}, ...}


def _scan(text: str, multibyte: bool, with_work: bool, with_dtypes: bool) -> Index:
    decoder = json.JSONDecoder()
    scan_once = decoder.scan_once  # type: ignore[attr-defined]
    ws = _skip
    index = Index({}, [], array.array("q"), array.array("d") if with_work else None, [] if with_dtypes else None,
                  has_data=False)
    framework = _Framework()
    to_bytes = _ByteOffsets(text) if multibyte else None
    i = ws(text, 0)
    if text[i] != "{":
        raise ValueError("top level")
    i = ws(text, i + 1)
    while text[i] != "}":
        key, i = scanstring(text, i + 1)
        i = ws(text, ws(text, i) + 1)  # past ':'
        if key == "data" and text[i] == "{":
            index.has_data = True
            index.names.clear()  # a repeated "data" key: the last one counts, as in json.load
            del index.offsets[:]
            index.work = array.array("d") if with_work else None
            index.dtypes = [] if with_dtypes else None
            i = ws(text, i + 1)
            positions: dict[str, int] = {}
            while text[i] != "}":
                name, i = scanstring(text, i + 1)
                i = ws(text, ws(text, i) + 1)
                start = i
                value, i = scan_once(text, i)
                framework.see(name, value)
                lo, hi = (start, i) if to_bytes is None else (to_bytes(start), to_bytes(i))
                k = positions.get(name)
                if k is None:  # a repeated entry name keeps its first place and its last value
                    k = positions[name] = len(index.names)
                    index.names.append(name)
                    index.offsets.extend((lo, hi))
                    if index.work is not None:
                        index.work.append(0.0)
                    if index.dtypes is not None:
                        index.dtypes.append("")
                else:
                    index.offsets[2 * k], index.offsets[2 * k + 1] = lo, hi
                if index.work is not None:
                    index.work[k] = work(_api_name(name), value)
                if index.dtypes is not None:
                    index.dtypes[k] = entry_dtypes(text[start:i])
                i = ws(text, i)
                if text[i] == ",":
                    i = ws(text, i + 1)
            i += 1
        else:
            value, i = scan_once(text, i)
            if key == "data":
                index.has_data, index.data_type = True, type(value).__name__
            elif key in _HEADER_KEYS:
                index.header[key] = value
        i = ws(text, i)
        if text[i] == ",":
            i = ws(text, i + 1)
    if ws(text, i + 1) != len(text):
        raise ValueError("extra data")
    if not (isinstance(index.header.get("framework"), str) and index.header["framework"]):
        index.header["framework"] = None
        index.header["inferred_framework"] = framework.guess or "pytorch"
    return index


def _skip(text: str, i: int) -> int:
    """The position of the first non-whitespace character at or after i."""
    match = _WS.match(text, i)
    return i if match is None else match.end()


def _api_name(entry_name: str) -> str:
    """`linear` of Functional.linear.0.forward (`vector_norm` of Torch.linalg.vector_norm.0.forward)."""
    parts = entry_name.split(".")
    return parts[-3] if len(parts) >= 4 else ""


class _ByteOffsets:
    """Character offsets of a str to byte offsets of its UTF-8 encoding, for increasing offsets."""

    def __init__(self, text: str) -> None:
        self.text, self.char, self.byte = text, 0, 0

    def __call__(self, char: int) -> int:
        self.byte += len(self.text[self.char:char].encode("utf-8"))
        self.char = char
        return self.byte


# ----------------------------------------------------------------------------- the cache folder


def cache_dir() -> Path:
    """$PYTEST_MSPROBE_INDEX_DIR, else a private folder in the temp dir."""
    folder = os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), f"pytest-msprobe-{os.getuid()}")
    return Path(folder)


def _cache_path(path: Path, stat: os.stat_result) -> tuple[Path, str]:
    where = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    what = hashlib.blake2b(f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}:{VERSION}".encode(),
                           digest_size=8).hexdigest()
    return cache_dir() / f"{where}-{what}.idx", where


def load_cached(path: Path, stat: os.stat_result) -> Index | None:
    """The cached index of this version of the file, if any (a damaged one is ignored)."""
    if stat.st_size < CACHE_MIN_BYTES:
        return None
    file, _ = _cache_path(path, stat)
    try:
        return Index.from_bytes(file.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        return None


def store(path: Path, stat: os.stat_result, index: Index) -> None:
    """Write the index for later processes (best effort: a read-only or full disk only costs time)."""
    if stat.st_size < CACHE_MIN_BYTES:
        return
    file, where = _cache_path(path, stat)
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(index.to_bytes())
        os.replace(tmp, file)
        for old in file.parent.glob(f"{where}-*.idx"):  # earlier versions of the same file
            if old != file:
                old.unlink(missing_ok=True)
    except OSError:
        pass
