"""The api_specs/ YAML files, loaded once per process into one plain mapping."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from api_specs import SPEC_DIR


class SpecError(Exception):
    """A spec file that cannot be used; the message names the file and key."""


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


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


@functools.lru_cache(maxsize=None)
def load_specs(spec_dir: str = str(SPEC_DIR)) -> dict[str, Any]:
    """Merge every *.yaml of the spec folder; a top-level key may appear in one file only."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for path in sorted(Path(spec_dir).glob("*.yaml")):
        try:
            content = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise SpecError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(content, dict):
            raise SpecError(f"{path}: top level must be a mapping, got {type(content).__name__}")
        for key, value in content.items():
            _check_numbers(value, f"{path}: {key}")
            if key in merged:
                raise SpecError(f"{path}: key {key!r} is already defined in {origin[key]}")
            merged[key] = value
            origin[key] = path.name
    return merged


def bare_name(api_name: str, specs: dict[str, Any]) -> str:
    """Resolve torch_npu aliases (fast_gelu -> npu_fast_gelu)."""
    return specs.get("aliases", {}).get(api_name, api_name)


def in_list(specs: dict[str, Any], api_name: str, *keys: str) -> bool:
    node: Any = specs
    for key in keys:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        node = node.get("apis", [])
    return api_name in (node or [])
