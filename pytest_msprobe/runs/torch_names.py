"""Which torch function a recorded `Torch.<name>` entry is: `torch.<name>` or `torch.linalg.<name>`.

msprobe records `torch.linalg.inv(A)` as `Torch.inv`, dropping the `linalg` namespace. Where torch has no
`torch.<name>` (inv, vector_norm, pinv, cholesky_ex, ...), the entry can only be `torch.linalg.<name>`.
Where an older namesake exists (svd, lstsq, solve, matrix_rank, vander, cond, norm, qr, lu, ...), the
recorded call picks it: the candidate whose signature accepts the recorded positional arguments and
keyword names; when both accept them, the one whose output shapes (computed on meta tensors, no data)
are the recorded ones. When that does not decide either, `torch.<name>` is kept (what a `Torch.` entry
always meant) and the label says the other one fits too. torch keeps a few removed functions (`torch.solve`, `torch.lstsq`,
`torch.eig`, `torch.matrix_rank`) as stubs that only raise; they are never candidates.

Many torch functions are builtins without an introspectable signature; their docstrings start with one
(`svd(input, some=True, compute_uv=True, *, out=None) -> ...`), which is parsed instead.
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Mapping
from typing import Any, Callable

import torch

_REMOVED_STUBS = "torch._linalg_utils"  # module of torch's raise-only stubs of removed functions
_DOC_SIGNATURE = re.compile(r"^\s*(?:[\w.]+\.)?(\w+)\((.*)\)\s*->")


def _attr(root: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """The signature of `fn`, from introspection or the first line of its docstring; None if unknown."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    for line in (getattr(fn, "__doc__", None) or "").strip().splitlines()[:3]:
        found = _DOC_SIGNATURE.match(line)
        if found is None:
            continue
        try:
            args = ast.parse(f"def _({found.group(2)}): pass").body[0].args  # type: ignore[attr-defined]
        except SyntaxError:
            return None
        kind = inspect.Parameter
        params = [kind(a.arg, kind.POSITIONAL_ONLY) for a in args.posonlyargs]
        params += [kind(a.arg, kind.POSITIONAL_OR_KEYWORD) for a in args.args]
        defaults = [None] * (len(params) - len(args.defaults)) + [True] * len(args.defaults)
        params = [p.replace(default=inspect.Parameter.empty if d is None else d) for p, d in zip(params, defaults)]
        if args.vararg is not None:
            params.append(kind(args.vararg.arg, kind.VAR_POSITIONAL))
        params += [kind(a.arg, kind.KEYWORD_ONLY, default=True)  # docstrings often omit `out`'s default
                   for a in args.kwonlyargs]
        if args.kwarg is not None:
            params.append(kind(args.kwarg.arg, kind.VAR_KEYWORD))
        try:
            return inspect.Signature(params)
        except ValueError:
            return None
    return None


def _fits(fn: Callable[..., Any], call: Mapping[str, Any] | None) -> bool:
    """Whether `fn` accepts the recorded call's number of positional arguments and keyword names."""
    if call is None:
        return True
    signature = _signature(fn)
    if signature is None:
        return True  # unknown: cannot be ruled out
    args, kwargs = call.get("input_args"), call.get("input_kwargs")
    n_args = len(args) if isinstance(args, list) else 0
    names = [str(k) for k in kwargs] if isinstance(kwargs, dict) else []
    try:
        signature.bind(*([None] * n_args), **dict.fromkeys(names))
    except TypeError:
        return False
    return True


def _alias_of(fn: Callable[..., Any], found: list[tuple[str, Callable[..., Any]]]) -> bool:
    """torch.linalg.matmul's documentation says it is exactly torch.matmul: then it is not a second candidate."""
    doc = getattr(fn, "__doc__", None) or ""
    return any(re.search(rf"^Alias for :func:`{re.escape(path)}`\s*$", doc, re.MULTILINE) for path, _ in found)


def torch_function(api_name: str, call: Mapping[str, Any] | None = None) -> tuple[Callable[..., Any], str]:
    """(function, dotted label) of a `Torch.<api_name>` entry; AttributeError when torch has neither."""
    candidates: list[tuple[str, Callable[..., Any]]] = []
    for path in (f"torch.{api_name}", f"torch.linalg.{api_name}"):
        try:
            fn = _attr(torch, path[len("torch."):])
        except AttributeError:
            continue
        if getattr(fn, "__module__", None) != _REMOVED_STUBS and callable(fn) and not _alias_of(fn, candidates):
            candidates.append((path, fn))
    if not candidates:
        raise AttributeError(api_name)
    fitting = [(path, fn) for path, fn in candidates if _fits(fn, call)] or candidates[:1]
    if len(fitting) > 1 and call is not None:  # both accept the arguments: do they give the recorded shapes?
        recorded = _recorded_shapes(call.get("output"))
        same = [(path, fn) for path, fn in fitting if recorded is not None and _meta_shapes(fn, call) == recorded]
        fitting = same if len(same) == 1 else fitting
    path, fn = fitting[0]
    if len(fitting) > 1:
        return fn, f"{path} ({fitting[1][0]} accepts the recorded arguments too)"
    return fn, path


def _recorded_shapes(output: Any) -> list[tuple[int, ...]] | None:
    from ..dump.reader import iter_leaves

    shapes = [tuple(leaf["shape"]) for leaf in iter_leaves(output) if isinstance(leaf, dict)
              and isinstance(leaf.get("shape"), list)]
    return shapes or None


def _meta_shapes(fn: Callable[..., Any], call: Mapping[str, Any]) -> list[tuple[int, ...]] | None:
    """Output shapes of `fn` on meta tensors shaped like the recorded inputs (no data, no compute)."""
    import warnings

    from ..inputs.build import TENSOR_TYPES, parse_dtype
    from .leaves import output_leaves

    def meta(value: Any) -> Any:
        if isinstance(value, list):
            return [meta(v) for v in value]
        if isinstance(value, dict) and value.get("type") in TENSOR_TYPES:
            return torch.empty(value["shape"], dtype=parse_dtype(value.get("dtype")), device="meta")
        if isinstance(value, dict) and value.get("type") in ("int", "float", "bool", "str"):
            return value.get("value")
        if value is None:
            return None
        raise ValueError("not a plain argument")

    try:
        args = [meta(a) for a in call.get("input_args") or []]
        kwargs = {k: meta(v) for k, v in (call.get("input_kwargs") or {}).items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(*args, **kwargs)
    except Exception:  # no meta kernel, an argument this cannot rebuild: shapes unknown
        return None
    return [tuple(t.shape) for t in output_leaves(out) if isinstance(t, torch.Tensor)]


__all__ = ["torch_function"]
