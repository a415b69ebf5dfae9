"""Rebuilding a recorded call's arguments: random from statistics, or the saved tensors.

Random tensors keep msprobe's contract (the recorded Min sits at flat index 0 and Max at the
last index). Floats are drawn in float32 (float64 for float64 tensors) and rounded once to the target
dtype; a range wider than the dtype's largest value is drawn as a convex combination in float64, so it
cannot overflow. Every value (floats, integers, bools) comes from the counter-based generator of
inputs/draw.py: one stream per random tensor, fixed by the item's seed and the tensor's place in the call.
Non-finite statistics no longer turn a whole tensor into NaN/inf: finite values are drawn and the
non-finite ones are planted at fixed positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, cast

import numpy as np
import torch

from ..dump.reader import Dump, resolve_tensor_path
from ..helper import share
from .draw import integers_into, tensor_key, uniform_16, uniform_into

TENSOR_TYPES = (
    "torch.Tensor",
    "torch.nn.parameter.Parameter",
    "torch.distributed.tensor.DTensor",
    "torch._subclasses.fake_tensor.FakeTensor",
    "torch.distributed._functional_collectives.AsyncCollectiveTensor",
    "mindspore.Tensor",  # MindSpore dumps: dtype strings like Float32 (parse_dtype), .npy files
    "mindspore.Parameter",
)
MAX_NESTING = 64  # argument lists/dicts nested deeper than this are refused (as dump.iter_leaves stops)
_FLOAT8 = ("torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float8_e4m3fnuz", "torch.float8_e5m2fnuz")


class InputError(Exception):
    """An argument that cannot be rebuilt; the item is skipped with this reason."""


@dataclass(frozen=True)
class DeviceArg:
    """A recorded `device=` value: the device side gets its own device, the bench drops it."""

    recorded: Any


@dataclass
class BuildContext:
    """Per-item state shared by every argument of one call."""

    dump: Dump
    generator: torch.Generator
    real_data: bool
    max_bytes: int
    clamp_min_zero: bool = False  # cross_entropy-style class targets
    requires_grad: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    loaded_files: int = 0
    devices: set[str] = field(default_factory=set)  # device types of the loaded .pt files' storages ("npu", "cpu")
    draws: int = 0  # random tensors drawn so far: the next one's stream is the next of `generator`'s seed
    threads: int = 1  # threads that draw a large tensor (CheckOptions.work_threads: this one and the helper);
    # the values do not depend on it


def parse_dtype(text: Any) -> torch.dtype:
    """`torch.float32`, or a MindSpore dtype name (`Float32`, `mindspore.bfloat16`) through the table in
    api_specs/mindspore.yaml."""
    if isinstance(text, str) and not text.startswith("torch."):
        text = _mindspore_dtype(text)
    if not isinstance(text, str) or not text.startswith("torch."):
        raise InputError(f"dtype {text!r} is not a torch dtype string (nor a MindSpore one)")
    dtype = getattr(torch, text[len("torch."):], None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"dtype {text!r} is unknown to torch {torch.__version__}")
    return dtype


def _mindspore_dtype(text: str) -> str:
    """MindSpore dtype name (`Float32`, as dumps write it, or `mindspore.float32`) -> torch dtype string."""
    from ..specs.loader import load_specs

    table = load_specs()["mindspore"]["dtypes"]
    attr = text[len("mindspore."):].rstrip("_") if text.startswith("mindspore.") else None
    for name, torch_name in table.items():
        if name == text or (attr is not None and name.lower() == attr):
            if not torch_name:
                raise InputError(f"MindSpore dtype {text!r} has no torch equivalent")
            return cast(str, torch_name)
    return text


def leaf_shape(leaf: dict[str, Any], where: str) -> list[int]:
    """A tensor leaf's recorded shape, refused unless it is a list of sizes (the recorded-output check reads it too)."""
    shape = leaf.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InputError(f"{where}: shape {shape!r} is not a list of integers")
    if any(d < 0 for d in shape):
        raise InputError(f"{where}: shape {shape} has a negative dimension")
    return shape


def _stat(leaf: dict[str, Any], key: str, where: str = "") -> float | None:
    """A numeric statistic; bools (bool tensors) count as 0/1, anything else as missing. JSON integers
    have no size limit: one past float64 (10**400) is a bad value, not an OverflowError."""
    value = leaf.get(key)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            digits = str(abs(value))
            raise InputError(f"{where + ': ' if where else ''}statistic {key}={'-' if value < 0 else ''}{digits[:10]}... ({len(digits)} "
                             f"digits) is beyond float64; the dump is corrupt") from None
    return None


def build(value: Any, ctx: BuildContext, where: str, *, kwarg: str | None = None) -> Any:
    """Turn one argument encoding (nested lists/dicts allowed) into a Python/torch value."""
    if value is None:
        return None
    if where.count(".") > MAX_NESTING:  # msprobe nests a few levels (tuples of tensors); deeper is corrupt
        raise InputError(f"{where.split('.')[0]}: arguments nested more than {MAX_NESTING} levels deep")
    if isinstance(value, list):
        return [build(v, ctx, f"{where}.{i}") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        raise InputError(f"{where}: unexpected JSON value {value!r}")
    if not value:
        raise InputError(
            f"{where}: recorded as {{}} (a positional dtype/device or object msprobe cannot encode); "
            "its value is unknown"
        )
    kind = value.get("type")
    if kind is None:
        if "class_type" in value:
            raise InputError(f"{where}: {value['class_type']} objects cannot be rebuilt")
        return {k: build(v, ctx, f"{where}.{k}") for k, v in value.items()}
    if kind in TENSOR_TYPES:
        return _tensor(value, ctx, where)
    if kind == "numpy.ndarray":
        return _tensor({**value, "dtype": f"torch.{value.get('dtype')}"}, ctx, where).numpy()
    if kind == "slice":
        bounds = value.get("value")
        if not isinstance(bounds, list) or len(bounds) != 3:
            raise InputError(f"{where}: slice value {bounds!r} is not [start, stop, step]")
        return slice(*bounds)
    if kind == "ellipsis":
        return Ellipsis
    if kind == "torch.Size":
        return torch.Size(value.get("value") or [])
    if kind in ("torch.dtype", "mindspore.dtype"):
        return parse_dtype(value.get("value"))
    if kind == "torch.device":
        return DeviceArg(value.get("value"))
    if kind == "torch.memory_format":
        fmt = getattr(torch, str(value.get("format")), None)
        if not isinstance(fmt, torch.memory_format):
            raise InputError(f"{where}: unknown memory format {value.get('format')!r}")
        return fmt
    if kind in ("torch.ProcessGroup", "torch.distributed.ReduceOp"):
        raise InputError(f"{where}: {kind} arguments need a process group")
    if "value" in value:
        return value["value"]  # int, float, bool, str and numpy scalars
    raise InputError(f"{where}: argument type {kind!r} is not supported")


def _tensor(leaf: dict[str, Any], ctx: BuildContext, where: str) -> torch.Tensor:
    dtype_text = leaf.get("dtype")
    shape = leaf_shape(leaf, where)
    if dtype_text in _FLOAT8:
        dtype = parse_dtype(dtype_text)
        gen_dtype = torch.float32
    else:
        dtype = gen_dtype = parse_dtype(dtype_text)
    numel = math.prod(shape)
    itemsize = gen_dtype.itemsize
    if numel * max(itemsize, 8) > ctx.max_bytes:
        raise InputError(
            f"{where}: shape {shape} ({dtype_text}) would need {numel * itemsize / 2**30:.1f} GiB "
            f"(x2 for the float64 bench), above the {ctx.max_bytes / 2**30:.1f} GiB limit"
        )
    tensor = None
    if ctx.real_data:
        tensor = load_saved(leaf, ctx, where, dtype, shape)
    if tensor is None:
        tensor = _random(leaf, ctx, where, gen_dtype, shape)
    if tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if leaf.get("requires_grad") is True and (dtype.is_floating_point or dtype.is_complex):
        ctx.requires_grad.add(id(tensor))
    return tensor


def load_saved(
    leaf: dict[str, Any], ctx: BuildContext, where: str, dtype: torch.dtype, shape: list[int]
) -> torch.Tensor | None:
    """A leaf's saved tensor file, loaded safely within the size limit; None when the dump did not save it. A
    tensor the dump holds in memory under the leaf's data_name (Dump.held) is that file's content."""
    held = ctx.dump.held.get(str(leaf.get("data_name"))) if ctx.dump.held else None
    if isinstance(held, torch.Tensor):
        if list(held.shape) != shape:
            raise InputError(f"{where}: the tensor given for it has shape {list(held.shape)}, the dump says {shape}")
        ctx.loaded_files += 1
        ctx.devices.add("cpu")
        return held.to(dtype) if held.dtype != dtype else held
    try:
        path = resolve_tensor_path(ctx.dump, leaf)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None
    if path is None:
        return None  # msprobe falls back to statistics for tensors it did not save (e.g. empty ones)
    if not path.is_file():
        raise InputError(f"{where}: tensor file {path} is missing")
    if path.stat().st_size > ctx.max_bytes:
        raise InputError(f"{where}: tensor file {path} is larger than the {ctx.max_bytes} byte limit")
    try:
        if path.suffix == ".pt":
            loaded = torch.load(path, map_location=lambda storage, where: _to_cpu(storage, where, ctx),
                                weights_only=True)
        elif path.suffix == ".npy":
            loaded = torch.from_numpy(np.load(path, allow_pickle=False))
        else:
            raise InputError(f"{where}: tensor file {path.name} is neither .pt nor .npy")
    except InputError:
        raise
    except Exception as exc:  # corrupt file, pickle refused by weights_only, ...
        raise InputError(f"{where}: cannot load {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(loaded, torch.Tensor):
        raise InputError(f"{where}: {path.name} holds a {type(loaded).__name__}, not a tensor")
    if list(loaded.shape) != shape:
        raise InputError(f"{where}: {path.name} has shape {list(loaded.shape)}, the dump says {shape}")
    ctx.loaded_files += 1
    # MindSpore saves bf16 as float32 .npy; the json dtype is the truth.
    return loaded.to(dtype) if loaded.dtype != dtype else loaded


def _to_cpu(storage: Any, location: str, ctx: BuildContext) -> Any:
    """torch.load's map_location: every storage stays on the CPU, and the device it was saved from (its
    location tag, "npu:0", "cuda:0" or "cpu": msprobe saves the tensors on their device) is noted."""
    ctx.devices.add(str(location).split(":", 1)[0])
    return storage


def _random(
    leaf: dict[str, Any], ctx: BuildContext, where: str, dtype: torch.dtype, shape: list[int]
) -> torch.Tensor:
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    hi = _stat(leaf, "Max", where)
    lo = _stat(leaf, "Min", where)
    if hi is None or lo is None:
        raise InputError(
            f"{where}: statistics Max={leaf.get('Max')!r} Min={leaf.get('Min')!r} are not numbers; "
            "cannot generate a random tensor (statistics-free dump?)"
        )
    if ctx.clamp_min_zero:
        lo = max(lo, 0.0)
        hi = max(hi, lo)
    if dtype == torch.bool:
        low, high = sorted((int(lo), int(hi)))
        flat = _integers(numel, low, high, ctx, where, as_bool=True)
        flat[0], flat[-1] = bool(lo), bool(hi)
        return flat.reshape(shape)
    if dtype.is_complex:
        raise InputError(f"{where}: complex tensors cannot be generated from statistics")
    if not dtype.is_floating_point:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise InputError(f"{where}: integer tensor with non-finite statistics Min={lo} Max={hi}")
        low, high = sorted((math.floor(lo), math.floor(hi)))
        flat = _integers(numel, low, high, ctx, where)
        flat[0], flat[-1] = math.floor(lo), math.floor(hi)
        return flat.reshape(shape).to(dtype)
    return _random_float(leaf, ctx, where, dtype, shape, (lo, hi))


def finite_range(leaf: dict[str, Any], lo: float, hi: float) -> tuple[float, float]:
    """A finite [low, high] for statistics holding inf/NaN: 1.x dumps carry the finite range
    (`*_except_inf_nan`); newer ones lose it, so a sane one is derived from the finite bound."""
    except_lo, except_hi = _stat(leaf, "Min_except_inf_nan"), _stat(leaf, "Max_except_inf_nan")
    base_lo = except_lo if except_lo is not None else lo
    base_hi = except_hi if except_hi is not None else hi
    flo = base_lo if math.isfinite(base_lo) else None
    fhi = base_hi if math.isfinite(base_hi) else None
    if flo is None:
        if fhi is None:
            return -1.0, 1.0
        return min(fhi, 0.0) - max(1.0, abs(fhi)), fhi
    if fhi is None:
        return flo, max(flo, 0.0) + max(1.0, abs(flo))
    return flo, fhi


def _random_float(
    leaf: dict[str, Any], ctx: BuildContext, where: str, dtype: torch.dtype, shape: list[int], bounds: tuple[float, float]
) -> torch.Tensor:
    """A float tensor of `shape` drawn within the recorded `bounds` (Min, Max), non-finite ones included."""
    lo, hi = bounds
    numel = math.prod(shape)
    has_nan = math.isnan(lo) or math.isnan(hi)
    pos_inf = hi == math.inf
    neg_inf = lo == -math.inf
    if lo == math.inf or hi == -math.inf:  # every element is that infinity
        return torch.full(shape, lo if lo == math.inf else hi, dtype=dtype)
    flo, fhi = lo, hi
    if has_nan or pos_inf or neg_inf:
        flo, fhi = finite_range(leaf, lo, hi)
    finfo = torch.finfo(dtype)
    flo, fhi = max(flo, finfo.min), min(fhi, finfo.max)
    if flo > fhi:
        flo, fhi = fhi, flo
    flat = _uniform(numel, dtype, flo, fhi, ctx)
    flat[0] = -math.inf if neg_inf else flo
    flat[-1] = math.inf if pos_inf else fhi
    if has_nan:
        nan_at = numel // 2 if numel > 2 else numel - 1
        flat[nan_at] = math.nan
        ctx.notes.append(f"{where}: statistics contain NaN; finite values drawn in [{flo:g}, {fhi:g}], NaN planted at flat index {nan_at}")
    if pos_inf or neg_inf:
        ctx.notes.append(f"{where}: statistics contain inf; planted at the ends, finite values in [{flo:g}, {fhi:g}]")
    return flat.reshape(shape)


def _uniform(numel: int, dtype: torch.dtype, lo: float, hi: float, ctx: BuildContext) -> torch.Tensor:
    """`numel` values in [lo, hi] of `dtype`, computed in float32 (float64 for float64) and rounded once,
    from the next stream of the item (inputs/draw.py: element i of a stream depends only on the stream's key
    and i). A range too wide for hi - lo is drawn in float64 as a convex combination, so it cannot overflow."""
    key = _next_key(ctx)
    narrow = hi - lo <= torch.finfo(dtype).max / 2  # else hi - lo overflows
    result, holder = _empty(numel, dtype)
    if not narrow and dtype != torch.float64:
        wide = np.empty(numel, np.float64)
        _fill(numel, ctx, lambda start, stop: uniform_into(key, start, wide[start:stop], lo, hi, wide=True))
        return result.copy_(torch.from_numpy(wide))  # rounded once to dtype
    if dtype in (torch.bfloat16, torch.float16):
        half = dtype == torch.float16
        _fill(numel, ctx, lambda start, stop: uniform_16(key, start, holder[start:stop], lo, hi, half=half))
        return result
    direct = dtype in (torch.float32, torch.float64)  # else (a float type numpy lacks) through a float32 buffer
    out = holder if direct else np.empty(numel, np.float32)
    _fill(numel, ctx, lambda start, stop: uniform_into(key, start, out[start:stop], lo, hi, wide=not narrow))
    return result if direct else result.copy_(torch.from_numpy(out))


def _integers(numel: int, low: int, high: int, ctx: BuildContext, where: str, *, as_bool: bool = False) -> torch.Tensor:
    """`numel` integers in [low, high] (int64), or whether each is > 0 (bool), from the item's next stream."""
    if low < -(1 << 63) or high >= 1 << 63:
        raise InputError(f"{where}: integer statistics Min={low} Max={high} are beyond int64; the dump is corrupt")
    key = _next_key(ctx)
    result, out = _empty(numel, torch.bool if as_bool else torch.int64)
    _fill(numel, ctx, lambda start, stop: integers_into(key, start, out[start:stop], low, high))
    return result


_HOLDERS = {torch.bfloat16: np.uint16, torch.float16: np.uint16, torch.float32: np.float32,
            torch.float64: np.float64, torch.int64: np.int64, torch.bool: np.bool_}


def _empty(numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
    """An uninitialised tensor in memory that numpy allocates: numpy asks Linux for transparent huge pages
    (madvise) on blocks of 4 MiB or more, so a large tensor's first touch faults 2 MiB pages instead of 4 KiB
    ones (1.4 -> 0.4 ns per float32 element on an AMD EPYC with THP on madvise); torch's allocator does not
    unless THP_MEM_ALLOC_ENABLE is set before its first allocation. torch cannot resize that storage, so a side
    takes a tensor built here as it is only where the call cannot grow it (runs/sharing.may_grow).
    Returns (the tensor, the numpy array of its memory: 16-bit floats as uint16 bits; None for other dtypes)."""
    kind = _HOLDERS.get(dtype)
    if kind is None:
        return torch.empty(numel, dtype=dtype), None
    holder: Any = np.empty(numel, kind)
    return torch.from_numpy(holder).view(dtype), holder


def _next_key(ctx: BuildContext) -> int:
    """The stream key of the item's next random tensor (the n-th of the context's generator seed)."""
    ctx.draws += 1
    return tensor_key(ctx.generator.initial_seed(), ctx.draws - 1)


def _fill(numel: int, ctx: BuildContext, fill: Callable[[int, int], None]) -> None:
    """fill(start, stop) over [0, numel) in chunks of _CHUNK elements; with ctx.threads > 1 the helper thread
    takes chunks beside this one when it is free (the values do not depend on which thread fills a chunk)."""
    share(numel, _CHUNK, fill, join=ctx.threads > 1)


_CHUNK = 1 << 20  # elements a thread fills at a time (a larger tensor may be shared with the helper thread)
