"""The api_specs/ YAML files, loaded once per process into one plain mapping, plus a user's overrides.

A user file (ini `msprobe_specs`) may override any shipped number or list, and add per-API
entries under `apis:` (algorithm, thresholds, skip reason, grad index). It is checked against the
shipped tree, so a typo or a string where a number belongs is rejected with the file and key.
"""
from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from api_specs import SPEC_DIR

ALGORITHMS = ("absolute_threshold", "binary_consistency", "ulp_compare", "thousandth_threshold",
              "accumulative_error_compare", "benchmark")
_API_KEYS = {"algorithm": str, "skip": str, "grad_index": int, "thresholds": dict}
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


class SpecError(Exception):
    """A spec file that cannot be used; the message names the file and key."""


def _check_numbers(node: Any, where: str) -> None:
    """YAML 1.1 reads `1e-16` (no dot) as a string; a threshold must never silently be one."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_numbers(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_numbers(value, f"{where}[{i}]")
    elif isinstance(node, str) and _NUMBER.match(node):
        raise SpecError(f"{where}: {node!r} was read as a string; write floats with a dot (1.0e-16)")


def _read(path: Path) -> dict[str, Any]:
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(content, dict):
        raise SpecError(f"{path}: top level must be a mapping, got {type(content).__name__}")
    return content


def load_specs(spec_dir: str = str(SPEC_DIR), user_file: str | None = None) -> dict[str, Any]:
    """Merge every *.yaml of the spec folder (a top-level key in one file only), then the user file.
    Read once per process for each pair, however it is passed (`load_specs()` and
    `load_specs(user_file=None)` are one entry of the cache, not two reads)."""
    return _load_specs(spec_dir, user_file)


@functools.cache
def _load_specs(spec_dir: str, user_file: str | None) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for path in sorted(Path(spec_dir).glob("*.yaml")):
        for key, value in _read(path).items():
            _check_numbers(value, f"{path}: {key}")
            if key in merged:
                raise SpecError(f"{path}: key {key!r} is already defined in {origin[key]}")
            merged[key] = value
            origin[key] = path.name
    merged.setdefault("apis", {})
    if user_file:
        _apply_user(merged, Path(user_file))
    return merged


def _apply_user(merged: dict[str, Any], path: Path) -> None:
    user = _read(path)
    user_apis: list[str] = []
    for key, value in user.items():
        _check_numbers(value, f"{path}: {key}")
        if key == "apis":
            if not isinstance(value, dict):
                raise SpecError(f"{path}: apis: must map API names to settings")
            for api, settings in value.items():
                _check_api(path, api, settings, merged["thresholds"])
            merged["apis"] = {**merged["apis"], **copy.deepcopy(value)}
            user_apis = list(value)
        elif key not in merged:
            raise SpecError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(merged))})")
        elif key == "mindspore" and isinstance(value, dict) and "apis" in value:
            merged[key] = _merge(merged[key], {k: v for k, v in value.items() if k != "apis"}, f"{path}: {key}")
            merged[key]["apis"] = {**merged[key]["apis"], **_check_ms_apis(path, value["apis"])}
        else:
            merged[key] = _merge(merged[key], value, f"{path}: {key}")
    _check_precision(merged["precision"], path)
    if user_apis:  # a misspelt name would match no item and be ignored without a word
        from .api_names import WHERE, unknown

        bad = unknown(user_apis, merged)
        if bad:
            raise SpecError(f"{path}: apis: unknown API name(s) {', '.join(bad)}: not in {WHERE}")


_FLOAT_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32", "torch.float64")


def _check_precision(precision: Mapping[str, Any], path: Path) -> None:
    """The bench's raise tables name float dtypes only (plan_precision turns them into torch dtypes)."""
    tables = {"raise_map": precision["raise_map"],
              **{f"{key}.{api}": t for key in ("raise_map_by_api", "strict_raise_map_by_api")
                 for api, t in precision.get(key, {}).items()}}
    named = [("mixed_raise_to", precision["mixed_raise_to"])] + [
        (where, dtype) for where, table in tables.items() for pair in table.items() for dtype in pair]
    for where, dtype in named:
        if dtype not in _FLOAT_DTYPES:
            raise SpecError(f"{path}: precision.{where}: {dtype!r} is not one of {', '.join(_FLOAT_DTYPES)}")


_MS_API_KEYS = {"torch": str, "params": list, "rename": dict, "drop": list, "skip": str}


def _check_ms_apis(path: Path, apis: Any) -> dict[str, Any]:
    """New or replaced entries of the MindSpore -> torch table (api_specs/mindspore.yaml `apis`)."""
    if not isinstance(apis, dict):
        raise SpecError(f"{path}: mindspore.apis: must map `Type.name` to settings")
    for api, settings in apis.items():
        _check_keys(f"{path}: mindspore.apis.{api}", settings, _MS_API_KEYS)
    return copy.deepcopy(apis)


def _check_keys(where: str, settings: Any, types: Mapping[str, type]) -> None:
    """`settings` is a mapping of known keys to values of their type (a bool is not a number)."""
    if not isinstance(settings, dict):
        raise SpecError(f"{where}: must be a mapping of {', '.join(types)}")
    for key, value in settings.items():
        if key not in types:
            raise SpecError(f"{where}: unknown key {key!r} (known: {', '.join(types)})")
        if not isinstance(value, types[key]) or isinstance(value, bool):
            raise SpecError(f"{where}.{key}: expected {types[key].__name__}, got {value!r}")


def _check_api(path: Path, api: str, settings: Any, shipped_thresholds: Mapping[str, Any]) -> None:
    where = f"{path}: apis.{api}"
    _check_keys(where, settings, _API_KEYS)
    if settings.get("algorithm") is not None and settings["algorithm"] not in ALGORITHMS:
        raise SpecError(f"{where}.algorithm: {settings['algorithm']!r} is not one of {', '.join(ALGORITHMS)}")
    if "thresholds" in settings:
        _merge(shipped_thresholds, settings["thresholds"], f"{where}.thresholds")


_DTYPE_KEY = re.compile(r"^torch\.[a-z0-9_]+$|^default$")


def _merge(base: Any, override: Any, where: str) -> Any:
    """Deep-merge `override` into a copy of `base`, refusing keys and types the shipped tree lacks."""
    if isinstance(base, dict):
        if not isinstance(override, dict):
            raise SpecError(f"{where}: expected a mapping, got {override!r}")
        out = dict(base)
        for key, value in override.items():
            if key in base:
                out[key] = _merge(base[key], value, f"{where}.{key}")
            elif isinstance(key, str) and _DTYPE_KEY.match(key):  # a per-dtype entry may be added anywhere
                out[key] = value
            else:
                raise SpecError(f"{where}: unknown key {key!r}")
        return out
    if isinstance(base, bool) or isinstance(override, bool):
        if type(base) is not type(override):
            raise SpecError(f"{where}: expected {type(base).__name__}, got {override!r}")
        return override
    if isinstance(base, (int, float)):
        if not isinstance(override, (int, float)):
            raise SpecError(f"{where}: expected a number, got {override!r}")
        return override
    if isinstance(base, list) and not isinstance(override, list):
        raise SpecError(f"{where}: expected a list, got {override!r}")
    if isinstance(base, str) and not isinstance(override, str):
        raise SpecError(f"{where}: expected a string, got {override!r}")
    return copy.deepcopy(override)


def api_settings(specs: Mapping[str, Any], api_name: str) -> Mapping[str, Any]:
    return specs.get("apis", {}).get(api_name) or {}


_MERGED: dict[tuple[int, str], Mapping[str, Any]] = {}


def thresholds_for(specs: Mapping[str, Any], api_name: str) -> Mapping[str, Any]:
    """The thresholds with the API's own overrides (from a user spec file) applied."""
    override = api_settings(specs, api_name).get("thresholds")
    if not override:
        shipped: Mapping[str, Any] = specs["thresholds"]
        return shipped
    key = (id(specs), api_name)
    if key not in _MERGED:
        _MERGED[key] = _merge(specs["thresholds"], override, f"apis.{api_name}.thresholds")
    return _MERGED[key]


def per_dtype(table: Mapping[str, Any], dtype: str) -> Any:
    """A thresholds table's entry for the device dtype, else its `default`."""
    return table[dtype] if dtype in table else table["default"]


def bare_name(api_name: str, specs: Mapping[str, Any]) -> str:
    """Resolve torch_npu aliases (fast_gelu -> npu_fast_gelu)."""
    name: str = specs.get("aliases", {}).get(api_name, api_name)
    return name


def in_list(specs: Mapping[str, Any], api_name: str, *keys: str) -> bool:
    node: Any = specs
    for key in keys:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        node = node.get("apis", [])
    return api_name in (node or [])


def error_kind(api: str, specs: Mapping[str, Any]) -> str:
    """The API's kind in api_specs/error_model.yaml: contraction, reduction, exact or elementwise."""
    return next((kind for kind in ("contraction", "reduction", "exact") if in_list(specs, api, "error_model", kind)),
                "elementwise")
