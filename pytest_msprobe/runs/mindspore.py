"""MindSpore dumps: the mint -> torch bench table, and re-running a recorded API in MindSpore.

* `torch_twin` turns a recorded `Mint.*` / `MintFunctional.*` / `Tensor.*` call into its PyTorch bench
  through api_specs/mindspore.yaml: a name-for-name default per API type, and per-API entries for
  names that differ (`dense` -> `torch.nn.functional.linear`) and for argument adaptations (positional
  order, renamed keywords). An API without a torch counterpart is skipped with a reason naming it.
* `run` executes the API in MindSpore on MindSpore's device (Ascend, GPU or CPU) from the torch
  arguments the item built (so inputs are generated exactly as for PyTorch items), and its backward
  with `mindspore.vjp` from the recorded cotangents. An op MindSpore has no kernel for on that device
  is skipped with MindSpore's own message (`unsupported_errors` in the YAML); any other exception is
  an API failure.

MindSpore is imported only here, only when an item needs it. This is the "small function" the MindSpore
re-run lives behind; it is not a backends.py device backend, because those run torch tensors through
torch autograd, while MindSpore has its own tensors and its own autograd.
"""
from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..inputs.build import DeviceArg
from .execution import NotCheckable

TARGETS = {"cpu": "CPU", "cuda": "GPU", "npu": "Ascend"}  # --msprobe-device -> MindSpore device_target


def table(specs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `mindspore:` section of the specs (api_specs/mindspore.yaml, with user overrides)."""
    section: Mapping[str, Any] | None = specs.get("mindspore")
    if section is None:
        from ..specs.loader import load_specs

        section = load_specs()["mindspore"]
    return section


def _lookup(dotted: str) -> Any:
    """`torch.nn.functional.linear` or `bench_functions.attention.flash_attention_score` -> the object (the
    longest importable module prefix, then attributes), or None when some part does not exist."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj
    return None


# ----------------------------------------------------------------------------- the torch bench


@dataclass
class Twin:
    """The torch bench of a MindSpore API: `fn` takes the MindSpore call's arguments (adapted inside)."""

    fn: Callable[..., Any]
    label: str  # dotted torch path
    api: str    # bare torch name: the key for categories, thresholds and the api_specs lists


def torch_twin(api_type: str, api_name: str, specs: Mapping[str, Any]) -> Twin:
    spec = table(specs)
    key = f"{api_type}.{api_name}"
    entry = spec.get("apis", {}).get(key) or {}
    if entry.get("skip"):
        raise NotCheckable(f"{key}: {entry['skip']} (api_specs/mindspore.yaml)")
    namespace = spec.get("namespaces", {}).get(api_type)
    if namespace is None and not entry.get("torch"):
        raise NotCheckable(f"{key}: MindSpore API type {api_type!r} has no torch bench "
                           "(api_specs/mindspore.yaml: mindspore.namespaces / mindspore.apis)")
    if api_type == "Tensor" and api_name not in spec.get("tensor_apis", ()) and key not in spec.get("apis", {}):
        raise NotCheckable(f"{key}: this MindSpore Tensor method is not in the MindSpore -> torch table "
                           "(api_specs/mindspore.yaml: mindspore.tensor_apis)")
    if not entry.get("torch") and not (namespace or {}).get("torch"):
        raise NotCheckable(f"{key}: MindSpore API type {api_type!r} has no torch bench for this API, only for those "
                           "in api_specs/mindspore.yaml (mindspore.apis)")
    path = entry.get("torch") or f"{namespace['torch']}.{api_name}"
    fn = _lookup(path)
    if not callable(fn):
        raise NotCheckable(f"{key}: no torch counterpart ({path} does not exist in torch {torch.__version__}); "
                           "map it in api_specs/mindspore.yaml (mindspore.apis) or msprobe_specs")
    rename = {**((namespace or {}).get("rename") or {}), **(entry.get("rename") or {})}
    params = entry.get("params")
    drop = set(entry.get("drop") or ())

    def bench(*args: Any, **kwargs: Any) -> Any:
        if params is not None:  # MindSpore's positional order differs from torch's: pass them by name
            if len(args) > len(params):
                raise NotCheckable(f"{key}: {len(args)} positional arguments, api_specs/mindspore.yaml names "
                                   f"only {len(params)} ({', '.join(params)})")
            kwargs, args = {**dict(zip(params, args)), **kwargs}, ()
        return fn(*args, **{rename.get(k, k): v for k, v in kwargs.items() if k not in drop})

    return Twin(bench, path, path.rsplit(".", 1)[-1])


# ----------------------------------------------------------------------------- running MindSpore


@functools.lru_cache(maxsize=1)
def _import() -> Any:
    try:
        return importlib.import_module("mindspore")
    except BaseException as exc:  # ImportError, missing shared libraries, numpy ABI mismatch, ...
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".strip()


def import_error() -> str | None:
    """Why MindSpore cannot be used in this process, or None."""
    found = _import()
    return found if isinstance(found, str) else None


def mindspore() -> Any:
    found = _import()
    if isinstance(found, str):
        raise NotCheckable(f"MindSpore is not installed or cannot be imported ({found}): re-running a MindSpore "
                           "API needs it (pip install mindspore); a tensor dump can be checked without it "
                           "(--msprobe-mode replay)")
    return found


@functools.cache
def _configure(device: str, index: int | None) -> str:
    """Select MindSpore's device once per process; returns its device_target."""
    ms = mindspore()
    if device != "auto":
        target = TARGETS.get(device)
        if target is None:
            raise NotCheckable(f"--msprobe-device {device}: not a MindSpore device (auto, cpu, cuda, npu)")
        try:
            if hasattr(ms, "set_device"):
                ms.set_device(target, index or 0)
            else:
                ms.set_context(device_target=target, device_id=index or 0)
        except Exception as exc:
            raise NotCheckable(f"MindSpore cannot use device {target}: {_first_line(exc)}") from None
    return str(ms.get_context("device_target"))


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _ms_dtype(ms: Any, dtype: torch.dtype, spec: Mapping[str, Any]) -> Any:
    for name, torch_name in spec["dtypes"].items():
        if torch_name == str(dtype):
            attr = name.lower()
            found = getattr(ms, attr, None) if attr != "bool" else getattr(ms, "bool_", None)
            if found is not None:
                return found
    raise NotCheckable(f"{dtype} has no MindSpore dtype in api_specs/mindspore.yaml")


@dataclass
class MsCall:
    """The MindSpore side of one item: the converted arguments and which tensors are differentiated."""

    ms: Any
    fn: Callable[..., Any]
    label: str
    target: str
    spec: Mapping[str, Any]
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)


def ms_callable(api_type: str, api_name: str, specs: Mapping[str, Any], device: str,
                index: int | None, framework: str = "mindspore") -> MsCall:
    """The MindSpore API a recorded entry names, on the selected MindSpore device. A mindtorch dump's
    torch-style entry runs the MindSpore API mindtorch maps it to (`mindtorch_namespaces`)."""
    ms = mindspore()
    target = _configure(device, index)
    spec = table(specs)
    key = "mindtorch_namespaces" if framework == "mindtorch" else "namespaces"
    namespace = spec.get(key, {}).get(api_type)
    if namespace is None or not namespace.get("mindspore"):
        raise NotCheckable(f"{api_type}.{api_name}: {framework} API type {api_type!r} is not re-run "
                           f"(api_specs/mindspore.yaml: mindspore.{key})")
    path = f"{namespace['mindspore']}.{api_name}"
    fn = _lookup(path)
    if not callable(fn):
        raise NotCheckable(f"{api_type}.{api_name}: MindSpore {ms.__version__} has no {path} "
                           "(dumped with another MindSpore version?)")
    return MsCall(ms, fn, path, target, spec)


def _to_ms(call: MsCall, value: Any) -> Any:
    ms = call.ms
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        array = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        return ms.Tensor(np.ascontiguousarray(array), dtype=_ms_dtype(ms, t.dtype, call.spec))
    if isinstance(value, torch.dtype):
        return _ms_dtype(ms, value, call.spec)
    if isinstance(value, DeviceArg):
        return None
    if isinstance(value, (list, tuple)):  # msprobe's MindSpore checker passes sequences as tuples
        return tuple(_to_ms(call, v) for v in value)
    if isinstance(value, dict):
        return {k: _to_ms(call, v) for k, v in value.items()}
    return value


def _to_torch(call: MsCall, value: Any) -> Any:
    ms = call.ms
    if isinstance(value, ms.Tensor):
        if value.dtype == ms.bfloat16:  # numpy has no bf16: widen (exact), then narrow back
            return torch.from_numpy(value.float().asnumpy()).to(torch.bfloat16)
        return torch.from_numpy(np.array(value.asnumpy()))
    if isinstance(value, (list, tuple)):
        return [_to_torch(call, v) for v in value]
    return value


def _leaves(call: MsCall, value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(call, v)]
    return [value]


def _unsupported(call: MsCall, exc: BaseException) -> str | None:
    text = str(exc)
    for pattern in call.spec.get("unsupported_errors", ()):
        if re.search(pattern, text):
            return _first_line(exc)
    return None


def _drain(ms: Any) -> None:
    """MindSpore runs ops asynchronously; a failed op's error is otherwise raised again by later ops."""
    for _ in range(3):
        try:
            ms.runtime.synchronize()
            return
        except Exception:
            continue


def run(call: MsCall, args: list[Any], kwargs: dict[str, Any], *, seed: int, grad_positions: list[int],
        cotangents: dict[int, torch.Tensor]) -> tuple[list[Any], dict[int, torch.Tensor]]:
    """Run the API (and, with `grad_positions`, its backward) in MindSpore.

    `grad_positions` index the tensors of the positional arguments (as execution.tensors_of orders
    them); `cotangents` maps forward output index -> recorded cotangent. Returns the output leaves as
    torch CPU tensors / Python values, and the gradient of each differentiated position.
    """
    ms = call.ms
    flat: list[Any] = []

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            flat.append(_to_ms(call, value))
            return _Slot(len(flat) - 1)
        if isinstance(value, (list, tuple)):
            return tuple(convert(v) for v in value)
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        return _to_ms(call, value)

    template = tuple(convert(a) for a in args)
    n_positional = len(flat)
    ms_kwargs = {k: _to_ms(call, v) for k, v in kwargs.items() if not isinstance(v, DeviceArg)}

    def fill(value: Any, tensors: list[Any]) -> Any:
        if isinstance(value, _Slot):
            return tensors[value.index]
        if isinstance(value, tuple):
            return tuple(fill(v, tensors) for v in value)
        if isinstance(value, dict):
            return {k: fill(v, tensors) for k, v in value.items()}
        return value

    ms.set_seed(seed % (2**31))
    try:
        if not grad_positions:
            out = call.fn(*fill(template, flat), **ms_kwargs)
            leaves = [_to_torch(call, leaf) for leaf in _leaves(call, out)]  # asnumpy: waits for the result
            return leaves, {}
        wanted = [p for p in grad_positions if p < n_positional]

        def forward(*xs: Any) -> Any:
            tensors = list(flat)
            for p, x in zip(wanted, xs):
                tensors[p] = x
            return call.fn(*fill(template, tensors), **ms_kwargs)

        out, vjp_fn = ms.vjp(forward, *[flat[p] for p in wanted])
        outs = _leaves(call, out)
        sens = []
        for i, o in enumerate(outs):
            cot = cotangents.get(i)
            if cot is None:
                sens.append(ms.ops.zeros_like(o))
            else:
                sens.append(_to_ms(call, cot.reshape(tuple(o.shape))).astype(o.dtype))
        grads = vjp_fn(sens[0] if not isinstance(out, (tuple, list)) else type(out)(sens))
        grads = grads if isinstance(grads, (tuple, list)) else (grads,)
        leaves = [_to_torch(call, leaf) for leaf in outs]
        return leaves, {p: _to_torch(call, g) for p, g in zip(wanted, grads)}
    except Exception as exc:
        _drain(ms)
        reason = _unsupported(call, exc)
        if reason is not None:
            raise NotCheckable(f"MindSpore {ms.__version__} cannot run {call.label} on {call.target}: {reason}") \
                from None
        raise


@dataclass(frozen=True)
class _Slot:
    index: int
