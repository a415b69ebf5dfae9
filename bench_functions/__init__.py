"""Pure-torch references for torch_npu fused ops, looked up by op name.

The built-in references are declared in `api_specs/bench_functions.yaml` (op name -> forward and,
where torch_npu exposes one, backward function); the modules of this package never register
themselves. Users add references for their own fused ops without editing the package:

* `bench_functions.register("npu_my_op")(fn)`, e.g. from a `conftest.py`;
* an entry point in the group `pytest_msprobe.bench_functions` that names a module (imported) or a
  callable (called with no arguments); either registers its functions with `register`.

`register` wins over the declaration, so a user can also replace a built-in reference.
Each function has the torch_npu signature and is called with the bench's raised-precision CPU
arguments (and, when the device is not an NPU, with the recorded-dtype device arguments).
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import types
import warnings
from typing import Any, Callable

ENTRY_POINT_GROUP = "pytest_msprobe.bench_functions"

_REGISTRY: dict[str, Callable[..., Any]] = {}
_entry_points_loaded = False


class BenchUnsupported(Exception):
    """The reference cannot reproduce this call (e.g. dropout with keep_prob < 1); the item skips."""


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make `fn` the reference of the torch_npu op `name` (overrides the YAML declaration)."""

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[name] = fn
        return fn

    return add


@functools.cache
def _specs() -> dict[str, Any]:
    """The shipped `api_specs/bench_functions.yaml` (declarations, aliases, output_postprocess), read
    directly: this package sits below pytest_msprobe, whose loader asks it which names exist."""
    import yaml

    from api_specs import SPEC_DIR

    content = yaml.safe_load((SPEC_DIR / "bench_functions.yaml").read_text(encoding="utf-8"))
    return content if isinstance(content, dict) else {}


def canonical(name: str) -> str:
    """torch_npu exposes some ops under a second name (fast_gelu -> npu_fast_gelu)."""
    alias: str = _specs().get("aliases", {}).get(name, name)
    return alias


def _declared() -> dict[str, dict[str, str]]:
    declared: dict[str, dict[str, str]] = _specs().get("bench_functions", {})
    return declared


def _load_entry_points() -> None:
    """Import every `pytest_msprobe.bench_functions` entry point once; a broken one only warns."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in _entry_points():
        try:
            obj = ep.load()
            if not isinstance(obj, types.ModuleType):
                obj()
        except Exception as exc:  # a third-party plugin must not break every other NPU item
            warnings.warn(f"bench_functions entry point {ep.name} = {ep.value} failed: {type(exc).__name__}: {exc}",
                          stacklevel=2)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _resolve(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), attr)
    return fn


def get(name: str) -> Callable[..., Any] | None:
    """The forward reference of `name` (aliases resolved), or None when there is none."""
    _load_entry_points()
    name = canonical(name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    target = _declared().get(name, {}).get("forward")
    return _resolve(target) if target else None


def get_backward(name: str) -> Callable[..., Any] | None:
    """The reference of the backward op torch_npu exposes for `name` (npu_rms_norm -> npu_rms_norm_backward)."""
    backward = _declared().get(canonical(name), {}).get("backward")
    return get(backward) if backward else None


def get_rounded(name: str) -> Callable[..., Any] | None:
    """The op computed with the intermediate roundings a sound 16-bit kernel may make (api_specs/
    bench_functions.yaml `rounded`), or None. A user's `register` of the op replaces the reference
    and drops this too: the rounded form belongs to the built-in reference."""
    name = canonical(name)
    if name in _REGISTRY:
        return None
    target = _specs().get("rounded", {}).get(name)
    return _resolve(target) if target else None


def names() -> list[str]:
    """Every op name with a reference: declared in api_specs/ or registered."""
    _load_entry_points()
    return sorted(set(_REGISTRY) | {n for n, d in _declared().items() if d.get("forward")})


def postprocess(api_name: str, outputs: list[Any], args: list[Any], kwargs: dict[str, Any], side: str) -> list[Any]:
    """Apply the op's `output_postprocess` rule (api_specs/bench_functions.yaml) to one side's outputs.

    `outputs: [i, ...]` keeps only those outputs (seeds and reserved buffers are not results).
    `valid_rows_from: <kwarg>` zeroes rows >= valid_len of every output with a first dimension: the NPU
    writes only the first valid_len rows and leaves the rest stale. valid_len comes from the group list
    in that kwarg, read as `group_list_type` says: 0 cumulative (last value), 1 counts (sum),
    2 [[group, count], ...] pairs (sum of counts); a Python list is always cumulative.
    """
    rule = _specs().get("output_postprocess", {}).get(canonical(api_name))
    if not rule or rule.get("side", "both") not in ("both", side):
        return outputs
    if "outputs" in rule:
        outputs = [outputs[i] for i in rule["outputs"] if i < len(outputs)]
    source = rule.get("valid_rows_from")
    if source is None or kwargs.get(source) is None:
        return outputs
    valid = valid_rows(kwargs[source], kwargs.get(rule.get("group_list_type_from", ""), rule.get("group_list_type", 0)))
    import torch

    def cut(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] <= valid:
            return t
        rows = (torch.arange(t.shape[0], device=t.device) < valid).view(-1, *([1] * (t.dim() - 1)))
        return torch.where(rows, t, torch.zeros((), dtype=t.dtype, device=t.device))

    return [cut(t) for t in outputs]


def valid_rows(group_list: Any, group_list_type: Any) -> int:
    """Rows an NPU grouped op writes, from its group list (torch_npu npu_grouped_matmul docs, group_list_type)."""
    if isinstance(group_list, (list, tuple)):
        return int(group_list[-1]) if group_list else 0  # List[int] is a non-negative increasing cumsum
    values = group_list.detach().cpu().long()
    kind = int(group_list_type) if group_list_type is not None else 0
    if kind == 0:
        return int(values[-1]) if values.numel() else 0
    if kind == 1:
        return int(values.sum())
    if kind == 2:
        return int(values.reshape(-1, 2)[:, 1].sum())
    raise ValueError(f"group_list_type {group_list_type!r} is not 0, 1 or 2")
