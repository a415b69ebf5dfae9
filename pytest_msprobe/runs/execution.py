"""Running one recorded call on the device under test and on the CPU bench.

The bench follows msprobe's precision rules (fp16/bf16 -> fp32, fp32 -> fp64, mixed -> fp32,
HF32 for fp32 convolutions: precision.py); the device runs the API in its recorded dtype, under autocast when
the dump shows an AMP region. An input a side needs as it is (on the CPU, in its own dtype) is taken
without a copy unless the call may write into it (runs/sharing.py decides which it may; a written input
goes to one side alone, every other side copying it), so in-place and `out=` calls never leak from one
side into another; torch's version counters check it after the runs (`Shared.changed`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple

import torch

from ..dump.reader import iter_leaves
from ..inputs.build import DeviceArg, InputError, parse_dtype
from . import tiles
from .leaves import map_structure, output_leaves, tensors_of  # re-exported: every stage walks values so
from .memory import fresh_copy

RAISABLE = (torch.float16, torch.bfloat16, torch.float32)
# half an ULP of 1 in each float dtype: what one rounding to it loses, relative to the value
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


class NotCheckable(Exception):
    """The call cannot be checked here; the message is the skip reason."""


@dataclass(frozen=True)
class Device:
    """A torch device of a backend (backends.py): `name` is the torch device string."""

    kind: str  # torch device type: "cpu" | "cuda" | "npu" | a backend's own
    index: int | None = None
    backend: Any = field(default=None, compare=False, repr=False)  # backends.Backend; None: plain torch

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @property
    def label(self) -> str:
        """The --msprobe-device name, with the torch device when they differ."""
        backend = getattr(self.backend, "name", None) or self.kind
        return self.name if backend in (self.kind, self.name) else f"{backend} ({self.name})"

    def synchronize(self) -> None:
        if self.backend is not None:
            self.backend.synchronize(self.name)
        elif self.kind == "cuda":
            torch.cuda.synchronize()
        elif self.kind == "npu":
            torch.npu.synchronize()  # type: ignore[attr-defined]

    def to_device(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A fresh copy on this device, as its backend moves tensors."""
        if self.backend is None:
            return fresh_copy(tensor, self.name, dtype)
        moved: torch.Tensor = self.backend.to_device(tensor, self.name, dtype).detach()
        if moved.device == tensor.device and moved.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
            moved = moved.clone()  # never share memory with the inputs the bench and reference copy
        return moved


# ----------------------------------------------------------------------------- API resolution


@dataclass
class Resolved:
    device_fn: Callable[..., Any]
    bench_fn: Callable[..., Any]
    label: str
    reference_vs_reference: bool = False
    kernel: str | None = None  # the --msprobe-kernels kernel that is the device side, if any
    call: dict[str, Any] | None = field(default=None, repr=False)  # the recorded entry it was resolved for
    api_path: str | None = None  # dotted path of the torch API (torch.linalg.inv), kept when a kernel substitutes


def _getattr_path(root: Any, dotted: str) -> Any:
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(api_type: str, api_name: str, device: Device, specs: dict[str, Any],
            call: dict[str, Any] | None = None, tiled_gradients: bool = True) -> Resolved:
    """The device and bench callables of a recorded API. `call`, the recorded forward entry, tells a
    `Torch.<name>` of torch.linalg from an older torch namesake (torch_names.py). A contraction's bench is
    computed in tiles of its output (tiles.py), whole or in pieces alike; its gradients too, unless
    `tiled_gradients` is false (tiles.by_tiles)."""
    resolved = _resolve(api_type, api_name, device, specs, call)
    bench = tiles.by_tiles(api_name, resolved.bench_fn, tiled_gradients)
    return resolved if bench is resolved.bench_fn else replace(resolved, bench_fn=bench)


def _resolve(api_type: str, api_name: str, device: Device, specs: dict[str, Any],
             call: dict[str, Any] | None) -> Resolved:
    reason = specs.get("unsupported_types", {}).get(api_type)
    if reason:
        raise NotCheckable(f"{api_type}.{api_name}: {reason}")
    try:
        if api_type == "Functional":
            fn = _getattr_path(torch.nn.functional, api_name)
            return Resolved(fn, fn, f"torch.nn.functional.{api_name}")
        if api_type == "Torch":
            from .torch_names import torch_function

            fn, label = torch_function(api_name, call)
            return Resolved(fn, fn, label, call=call, api_path=label.split(" ")[0])
        if api_type == "Tensor":
            fn = getattr(torch.Tensor, api_name)
            if api_name == "__getitem__":
                fn = _getitem
            elif api_name == "__eq__":
                fn = _eq
            return Resolved(fn, fn, f"torch.Tensor.{api_name}")
        if api_type == "Aten":  # online calls name the overload packet (Aten.mm.1); dumps skip by type above
            fn = getattr(torch.ops.aten, api_name)
            return Resolved(fn, fn, f"torch.ops.aten.{api_name}")
    except AttributeError:
        raise NotCheckable(
            f"{api_type}.{api_name}: no such API in torch {torch.__version__} (dumped with another version?)"
        ) from None
    if api_type == "NPU":
        return _resolve_npu(api_name, device, specs)
    raise NotCheckable(f"API type {api_type!r} of {api_type}.{api_name} is not executable")


def _resolve_npu(api_name: str, device: Device, specs: dict[str, Any]) -> Resolved:
    import bench_functions

    name = specs.get("aliases", {}).get(api_name, api_name)
    bench = bench_functions.get(name)
    if bench is None:
        raise NotCheckable(f"NPU.{api_name}: no bench function for {name} in bench_functions/")
    if device.kind == "npu":
        import torch_npu

        try:
            fn = _getattr_path(torch_npu, api_name)
        except AttributeError:
            raise NotCheckable(f"NPU.{api_name}: torch_npu has no {api_name}") from None
        return Resolved(fn, bench, f"torch_npu.{api_name}")
    return Resolved(bench, bench, f"bench_functions.{name} on {device.kind}", reference_vs_reference=True)


def _getitem(self: torch.Tensor, index: Any) -> Any:
    """msprobe's indexing rules for tensor indices, applied identically on both sides."""
    if isinstance(index, torch.Tensor):
        if index.dtype == torch.uint8:
            index = index.bool()
        if index.dtype == torch.bool:
            if index.shape == self.shape:
                return torch.masked_select(self, index)
            return self[index.nonzero(as_tuple=True)]
        if index.dim() <= 1:
            return self[index.tolist()]
        return torch.stack([_getitem(self, row) for row in index])
    if isinstance(index, list) and any(isinstance(i, (torch.Tensor, list, tuple, slice)) or i is None or i is Ellipsis
                                       for i in index):
        # a dump keeps a tuple index as a list; torch reads such a list as the tuple, with a deprecation warning
        index = tuple(index)
    return self[index]


def _eq(self: torch.Tensor, other: Any) -> Any:
    return False if other is None else torch.Tensor.__eq__(self, other)


# ----------------------------------------------------------------------------- argument sets


def seed_random_apis(seed: int, device: Any = None) -> None:
    """Seed the generators random APIs inside a call draw from: CPU's, and the device's own.

    Not torch.manual_seed: for every device type that is not initialised it records a lazy call with
    a formatted stack trace, milliseconds per item.
    """
    torch.random.default_generator.manual_seed(seed)  # type: ignore[attr-defined]  # torch.random does not re-export it
    kind = getattr(device, "kind", None)
    if kind == "cuda":
        torch.cuda.manual_seed(seed)
    elif kind == "npu":
        torch.npu.manual_seed(seed)  # type: ignore[attr-defined]


class Shared:
    """The item's input tensors that its sides take as they are, without a copy (make_side's `shared`).

    `written` holds the ids of the inputs the call may write into (runs/sharing.written_inputs; None: it
    cannot be told, and nothing is shared). Every other input is read by every side that takes it; a written
    one is given to one side alone (the first that needs it as it is, when `give`), every other side copying
    it before any side runs. The safety net: torch bumps a tensor's version counter on every write through
    it or any alias (detach() and views share the counter), so `changed()` names the read inputs that a run
    wrote into after all; the item is then checked again with a copy per side (check/protocol.check_entry)."""

    def __init__(self, written: Collection[int] | None, *, give: bool = True) -> None:
        self.written = written
        self.give = give
        self._read: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (the input, its version when first taken)
        self._given: set[int] = set()

    def take(self, tensor: torch.Tensor, *, leaf: bool = False) -> torch.Tensor | None:
        """`tensor` itself (detached) for one more side, or None where that side needs its own copy. `leaf`:
        it becomes the side's gradient leaf, which the API never sees (make_side hands it a clone)."""
        key = id(tensor)
        if self.written is None or key in self._given:
            return None
        if key in self.written and not leaf:
            if not self.give or key in self._read:
                return None
            self._given.add(key)
        else:
            self._read.setdefault(key, (tensor, tensor._version))
        return tensor.detach()

    def changed(self) -> list[torch.Tensor]:
        """The read inputs whose version counter moved since a side took them."""
        return [tensor for tensor, version in self._read.values() if tensor._version != version]


@dataclass
class Side:
    """One side's arguments plus the leaves whose gradients we collect."""

    args: list[Any]
    kwargs: dict[str, Any]
    grad_leaves: list[tuple[int, torch.Tensor]] = field(default_factory=list)


class Target(NamedTuple):
    """Where one side's tensors go: its device, the dtype each is cast to, whether it is the bench side, the
    backend's `move` (None: torch's), and the CPU tensors it may take uncopied (`owned`, `shared`: make_side)."""
    device: str
    dtype_for: Callable[[torch.Tensor], torch.dtype]
    bench: bool
    move: Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None = None
    owned: Collection[int] = ()
    shared: Shared | None = None


def make_side(args: list[Any], kwargs: dict[str, Any], *, target: Target, requires_grad: set[int],
              want_grad: bool) -> Side:
    """Every tensor cast and moved (by `move`, a backend's, when given); grad-requiring inputs become
    non-leaf clones. A tensor already on the CPU in the side's dtype, for a side on the CPU that torch moves
    to (no `move`), is taken without a copy when its id is in `owned` (a temporary made for this side alone)
    or `shared` lets this side have it; every other one is a fresh copy."""
    device, dtype_for, bench, move, owned, shared = target
    side = Side([], {})
    counter = [0]

    def convert(v: Any, in_kwargs: bool, key: str | None = None) -> Any:
        if isinstance(v, DeviceArg):
            return "cpu" if bench else device
        if not isinstance(v, torch.Tensor):
            return v
        position = counter[0]
        counter[0] += 1
        dtype = dtype_for(v)
        grad = want_grad and id(v) in requires_grad and key != "out" and dtype.is_floating_point
        taken = None
        if move is None and device == "cpu" and v.device.type == "cpu" and v.dtype == dtype:
            taken = v.detach() if id(v) in owned else shared.take(v, leaf=grad) if shared is not None else None
        if taken is not None:
            t = taken
        else:
            t = move(v.detach(), dtype) if move is not None else fresh_copy(v.detach(), device, dtype)
        if grad:
            leaf = t.requires_grad_(True)
            side.grad_leaves.append((position, leaf))
            return leaf.clone()  # non-leaf, so in-place APIs work under autograd
        return t

    side.args = [map_structure(lambda x: convert(x, False), a) for a in args]
    for key, value in kwargs.items():
        if key == "device" and isinstance(value, DeviceArg) and bench:
            continue  # the bench always runs on CPU

        def to_side(x: Any, k: str = key) -> Any:
            return convert(x, True, k)

        side.kwargs[key] = map_structure(to_side, value)
    return side


def first_output_dtype(encoded_output: Any) -> torch.dtype | None:
    """The AMP hint: dtype of the first recorded float output (namedtuples included; MindSpore's names too)."""
    for leaf in iter_leaves(encoded_output):
        if isinstance(leaf, dict) and isinstance(leaf.get("dtype"), str):
            try:
                dtype = parse_dtype(leaf["dtype"])
            except InputError:
                return None
            return dtype if dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else None
    return None


def first_output_shape(encoded_output: Any) -> tuple[int, ...] | None:
    """The recorded shape of the first tensor output, or None."""
    for leaf in iter_leaves(encoded_output):
        if isinstance(leaf, dict) and isinstance(leaf.get("shape"), list):
            return tuple(int(n) for n in leaf["shape"])
    return None


def run_side(fn: Callable[..., Any], side: Side, *, autocast: torch.dtype | None, device_type: str,
             grad: bool) -> Any:
    context = torch.enable_grad() if grad else torch.no_grad()
    with context:
        if autocast is not None:
            with torch.autocast(device_type=device_type, dtype=autocast):
                return fn(*side.args, **side.kwargs)
        return fn(*side.args, **side.kwargs)


def broken_precondition(device_exc: BaseException | None, run_bench: Callable[[], Any], fn: Callable[..., Any],
                        side: Callable[[], Side]) -> str | None:
    """Why a device exception on generated inputs is a skip, or None when it is a failure.

    It is a skip when the bench raises the same way (type, and message up to numbers) while the same call on
    meta tensors (shapes and dtypes only) goes through: the arguments are well-formed and only their random
    values break a precondition of the API (Cholesky of a matrix that is not positive-definite, an index out of
    range). A call that fails on meta tensors too, or has no meta kernel, stays a failure. `side` gives the
    bench's side once `run_bench` has run (the helper thread may be making it until then).
    """
    def gist(exc: BaseException) -> str:
        lines = str(exc).strip().splitlines()
        return re.sub(r"\d+", "#", lines[0] if lines else "")

    if device_exc is None:
        return None
    try:
        run_bench()
        return None
    except Exception as exc:
        if type(exc) is not type(device_exc) or gist(exc) != gist(device_exc):
            return None
        bench_exc = exc
    bench = side()
    meta = map_structure(lambda v: torch.empty_like(v, device="meta") if isinstance(v, torch.Tensor) else v,
                         [bench.args, bench.kwargs])
    try:
        with torch.no_grad():
            fn(*meta[0], **meta[1])
    except Exception:
        return None
    first = str(bench_exc).strip().splitlines()
    return (f"the generated inputs break a precondition of the API (not a kernel failure): the device and the "
            f"bench both raise {type(bench_exc).__name__}: {first[0] if first else ''}")


def to_cpu(value: Any) -> Any:
    return map_structure(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, value)


def pair_cotangents(outputs: list[Any], cotangents: list[Any], grad_index: int | None) -> list[tuple[int, Any]]:
    """Which forward outputs the recorded backward inputs belong to."""
    differentiable = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
    if grad_index is not None:
        cot = cotangents[grad_index] if len(cotangents) == len(outputs) else (cotangents[0] if cotangents else None)
        return [(grad_index, cot)] if cot is not None and grad_index in differentiable else []
    if len(outputs) == 1:
        return [(0, cotangents[0])] if cotangents and cotangents[0] is not None and differentiable else []
    if len(cotangents) == len(outputs):
        return [(i, c) for i, c in enumerate(cotangents) if c is not None and i in differentiable]
    raise NotCheckable(
        f"{len(outputs)} outputs but {len(cotangents)} recorded gradients and no grad_index in api_specs/apis.yaml"
    )


def backward(outputs: list[Any], pairs: list[tuple[int, Any]], device: str) -> None:
    tensors, grads = [], []
    for index, cot in pairs:
        out = outputs[index]
        tensors.append(out)
        grads.append(cot.detach().to(device=device, dtype=out.dtype).reshape(out.shape))
    _run_backward(tensors, grads)


def _run_backward(tensors: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """torch.autograd.backward without its argument checks, whose first call imports sympy (~0.5 s per
    process, every xdist worker): the gradients already have their outputs' shapes, dtypes and devices."""
    engine_run = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if engine_run is None or any(not isinstance(t, torch.Tensor) or t.is_nested for t in tensors):
        torch.autograd.backward(tensors, grads)
        return
    engine_run(tuple(tensors), tuple(grads), False, False, (), allow_unreachable=True, accumulate_grad=True)


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


__all__ = [
    "Device", "InputError", "NotCheckable", "Resolved", "Shared", "Side", "Target",
    "backward", "first_output_dtype", "make_side", "map_structure",
    "output_leaves", "pair_cotangents", "resolve", "run_side", "tensors_of", "to_cpu",
]
