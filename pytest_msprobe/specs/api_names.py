"""Is a bare API name one that a dump can record? For the names a user writes: `msprobe_specs` `apis:` keys
and the white/black lists of msprobe's config.json (`--msprobe-config`).

msprobe rejects list entries that are not in its list of hooked APIs; a misspelt name would otherwise be
accepted and silently match nothing. Known here: the attributes of torch.nn.functional, torch.Tensor, torch and
torch.linalg (msprobe records `torch.linalg.inv` as `inv`), every name api_specs/ mentions (categories, per-API
rules, MindSpore table), the NPU ops with a bench function, and torch_npu's own names where torch_npu imports;
without torch_npu, names of its `npu_` family are accepted unchecked. Imports torch: called only when the user
gave such names.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def _strings(node: Any) -> Iterable[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


_CACHE: dict[int, tuple[Mapping[str, Any], frozenset[str]]] = {}


def _spec_names(specs: Mapping[str, Any]) -> frozenset[str]:
    """Every API name api_specs/ (with the user's overrides) mentions."""
    cached = _CACHE.get(id(specs))
    if cached is not None and cached[0] is specs:
        return cached[1]
    names: set[str] = set()
    cats = specs.get("categories", {})
    for algorithm in cats.get("lookup_order", []):
        names.update(_strings(cats.get(algorithm)))
    for key in ("always_skip", "random_apis"):
        names.update(_strings(specs.get(key, {}).get("apis")))
    names.update(_strings(specs.get("dropout_apis")))
    names.update(_strings(specs.get("not_detach")))
    backward = specs.get("backward", {})
    names.update(_strings(backward.get("not_backward")))
    names.update(_strings(backward.get("unsupported")))
    names.update(backward.get("grad_index", {}))
    names.update(specs.get("forward_output_index", {}))
    precision = specs.get("precision", {})
    names.update(precision.get("raise_map_by_api", {}))
    names.update(precision.get("strict_raise_map_by_api", {}))
    names.update(_strings(precision.get("not_raise")))
    names.update(_strings(precision.get("bitcast")))
    names.update(_strings(precision.get("hf32")))
    for listed in (precision.get("tf32") or {}).values():
        names.update(_strings(listed))
    for rule in specs.get("convert", {}).values():
        names.update(_strings(rule.get("apis")))
    for listed in specs.get("preprocess", {}).values():
        names.update(_strings(listed))
    names.update(specs.get("bench_functions", {}))
    names.update(specs.get("aliases", {}))
    th = specs.get("thresholds", {})
    names.update(_strings(th.get("quantization", {}).get("apis")))
    for listed in th.get("monitoring_level_apis_26x", {}).values():
        names.update(_strings(listed))
    ms = specs.get("mindspore", {})
    names.update(key.split(".", 1)[1] for key in ms.get("apis", {}) if "." in key)
    names.update(_strings(ms.get("tensor_apis")))
    _CACHE[id(specs)] = (specs, frozenset(names))
    return _CACHE[id(specs)][1]


def _known(name: str, specs: Mapping[str, Any]) -> bool:
    import torch

    if name in _spec_names(specs):
        return True
    roots = (torch.nn.functional, torch.Tensor, torch, torch.linalg)
    for root in roots:
        obj: Any = root
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return True
    import bench_functions

    if name in bench_functions.names():
        return True
    from ..npu_import import npu_import_error

    if npu_import_error() is None:
        import torch_npu

        return hasattr(torch_npu, name)
    return name.startswith(("npu_", "_npu_"))


def unknown(names: Iterable[str], specs: Mapping[str, Any]) -> list[str]:
    """The names no dump can record, each with a suggestion when one is close: `gleu (did you mean gelu?)`."""
    bad = [str(n) for n in names if not _known(str(n), specs)]
    if not bad:
        return []
    import torch

    pool = sorted(_spec_names(specs) | {n for root in (torch.nn.functional, torch.Tensor, torch, torch.linalg)
                                        for n in dir(root) if not n.startswith("__")})
    out = []
    for name in bad:
        close = difflib.get_close_matches(name, pool, n=3, cutoff=0.6)
        out.append(f"{name} (did you mean {' or '.join(close)}?)" if close else name)
    return out


WHERE = ("torch.nn.functional, torch.Tensor, torch, torch.linalg, bench_functions, api_specs or torch_npu "
         "(without torch_npu: npu_* names are accepted unchecked)")

__all__ = ["WHERE", "unknown"]
