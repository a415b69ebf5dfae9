"""`--msprobe-kernels module:attr`: your own kernels on the device side, judged against the bench.

The contract (docs/how-to/own-kernels.md):

* `module:attr` names a mapping `{API name: kernel}`. `module` is a dotted module name importable
  from sys.path (the `pythonpath` ini key adds folders) or a path to a `.py` file (relative to the
  current directory, or to the ini file for the ini key `msprobe_kernels`; its folder is put on
  sys.path, as pytest does for test files). `attr` may be dotted.
* Keys are API names as msprobe writes them, without call index and direction:
  `Functional.layer_norm`, `Torch.matmul`, `Tensor.add`, `NPU.npu_rms_norm`.
* Values are callables with the API's signature (a `Tensor.*` kernel takes `self` first), or
  `"module:function"` strings imported when the first item of that API runs.
* The mapping's module is imported when pytest configures, in every process, because collection
  selects items by API name; keep it cheap — torch-free, with string values — and put the kernels
  (which import torch, Triton, ...) in the modules the strings name. They are imported lazily, at
  run time, in the process that runs the items.

Items of APIs the mapping does not name are deselected ("N deselected: no kernel") unless
`msprobe_kernels_run_all`, which runs them with the usual APIs. For mapped APIs the device side
calls the kernel (on `--msprobe-device`, with the recorded-dtype inputs, inside the device-call
boundary); the bench and any reference run stay torch's own API. The record's `impl` and the
failure report say `<kernel> (substituted)`.

Torch-free at import.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..dump.reader import KNOWN_TYPES, parse_entry_name


class KernelSpecError(Exception):
    """--msprobe-kernels names no usable mapping; the message says what is wrong (a usage error at configure)."""


class KernelError(Exception):
    """A kernel cannot be loaded at run time; the item fails with this message."""


_KEY = re.compile(r"^(?P<type>[A-Za-z]+)\.(?P<api>[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?)$")
# Python spellings of an API and msprobe's type for them (first match wins)
_HINT_TYPES = {"torch.nn.functional.": "Functional", "F.": "Functional", "torch.Tensor.": "Tensor",
               "torch_npu.": "NPU", "torch.": "Torch"}


def key_error(key: Any) -> str | None:
    """Why a mapping key is not an API name (None when it is one)."""
    if not isinstance(key, str):
        return f"key {key!r} is a {type(key).__name__}, expected an API name such as 'Functional.layer_norm'"
    for prefix in _HINT_TYPES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return (f"key {key!r}: msprobe names this API '{_HINT_TYPES[prefix]}.{key[len(prefix):]}' "
                    "(<Type>.<api>, as in the dump)")
    parts = key.split(".")
    if len(parts) >= 3 and (parts[-1] in ("forward", "backward") or parts[-1].isdigit()
                            or (len(parts) >= 4 and parts[-2].isdigit())):
        try:
            entry = parse_entry_name(key if parts[-1] in ("forward", "backward") else f"{key}.forward")
            return f"key {key!r} is a dump entry; use the API name '{entry.api_type}.{entry.api_name}'"
        except ValueError:
            pass
    match = _KEY.match(key)
    if match is None:
        return (f"key {key!r} is not an API name of the form <Type>.<api>, such as 'Functional.layer_norm', "
                "'Torch.matmul', 'Tensor.add' or 'NPU.npu_rms_norm'")
    if match["type"] not in KNOWN_TYPES:
        return f"key {key!r}: {match['type']!r} is not an msprobe API type ({', '.join(KNOWN_TYPES[:4])}, ...)"
    return None


def api_key(item_name: str) -> str | None:
    """`Functional.softmax.1.forward` -> `Functional.softmax` (None when the name does not parse)."""
    try:
        entry = parse_entry_name(item_name)
    except ValueError:
        return None
    return f"{entry.api_type}.{entry.api_name}"


def label(value: Any) -> str:
    """How a kernel is named in records and reports: `module:function`."""
    if isinstance(value, str):
        return value
    module = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    return f"{module}:{name}" if module and name else repr(value)


def _split(spec: str, where: str) -> tuple[str, str]:
    module, colon, attr = spec.rpartition(":")
    if not colon or not module or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise KernelSpecError(f"{where}: {spec!r} is not module:attr (e.g. my_kernels:KERNELS or "
                                "path/to/my_kernels.py:KERNELS)")
    return module, attr


def _is_path(module: str) -> bool:
    return module.endswith(".py") or "/" in module or "\\" in module


def normalize(spec: str, base: Path, where: str) -> str:
    """A file path becomes absolute (so xdist workers and rerun commands find it)."""
    module, attr = _split(spec, where)
    if _is_path(module):
        path = Path(module)
        return f"{(path if path.is_absolute() else base / path).resolve()}:{attr}"
    return f"{module}:{attr}"


def _import(module: str, where: str) -> Any:
    if _is_path(module):
        path = Path(module)
        if not path.is_file():
            raise KernelSpecError(f"{where}: no such file: {path}")
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # its sibling modules ("module:function" values) import too
        name = path.stem
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise KernelSpecError(f"{where}: cannot import {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise KernelSpecError(f"{where}: importing {path} raised {type(exc).__name__}: {exc}") from None
        return mod
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise KernelSpecError(
                f"{where}: cannot import module {module!r} ({exc}); it must be importable from sys.path (the "
                "pythonpath ini key adds folders) or be given as a path to a .py file") from None
        raise KernelSpecError(f"{where}: importing {module!r} raised ModuleNotFoundError: {exc}") from None
    except Exception as exc:
        raise KernelSpecError(f"{where}: importing {module!r} raised {type(exc).__name__}: {exc}") from None


def _value_error(key: str, value: Any) -> str | None:
    if callable(value):
        return None
    if isinstance(value, str):
        module, colon, attr = value.rpartition(":")
        if colon and module and attr and all(p.isidentifier() for p in attr.split(".")):
            return None
        return f"kernel of {key!r} is the string {value!r}, expected 'module:function'"
    return (f"kernel of {key!r} is {type(value).__name__} {value!r}, expected a callable with the API's signature "
            "or a 'module:function' string")


@dataclass
class KernelTable:
    """A validated mapping; kernels given as strings are imported on first use."""

    spec: str
    mapping: Mapping[str, Any]
    resolved: dict[str, tuple[Callable[..., Any], str]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.mapping)

    def kernel(self, key: str) -> tuple[Callable[..., Any], str] | None:
        """(callable, label) for an API name, or None when it is not mapped. Raises KernelError."""
        if key not in self.mapping:
            return None
        if key not in self.resolved:
            value = self.mapping[key]
            fn = value
            if isinstance(value, str):
                module, _, attr = value.rpartition(":")
                try:
                    fn = importlib.import_module(module)
                    for part in attr.split("."):
                        fn = getattr(fn, part)
                except Exception as exc:
                    raise KernelError(f"--msprobe-kernels {self.spec}: kernel {value!r} of {key} cannot be "
                                      f"loaded ({type(exc).__name__}: {exc})") from exc
                if not callable(fn):
                    raise KernelError(f"--msprobe-kernels {self.spec}: kernel {value!r} of {key} is "
                                      f"{type(fn).__name__}, not a callable")
            self.resolved[key] = (fn, label(value))
        return self.resolved[key]


def load(spec: str, where: str = "--msprobe-kernels") -> KernelTable:
    """Import the mapping's module and validate the mapping; a KernelSpecError says what is wrong."""
    module, attr = _split(spec, where)
    obj = _import(module, f"{where} {spec}")
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise KernelSpecError(f"{where} {spec}: {module} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, Mapping):
        raise KernelSpecError(f"{where} {spec}: {attr} is a {type(obj).__name__}, expected a mapping "
                                "{API name: kernel}, e.g. {'Functional.layer_norm': my_layer_norm}")
    if not obj:
        raise KernelSpecError(f"{where} {spec}: {attr} is empty; it must map at least one API")
    for key, value in obj.items():
        problem = key_error(key) or _value_error(key, value)
        if problem:
            raise KernelSpecError(f"{where} {spec}: {problem}")
    return KernelTable(spec, dict(obj))


# Tables loaded when pytest configured, by spec; the items of that session look theirs up here.
_TABLES: dict[str, KernelTable] = {}


def preload(spec: str, where: str) -> KernelTable:
    """Load the table when pytest configures, for the items of that session."""
    _TABLES[spec] = load(spec, where)
    return _TABLES[spec]


def table(spec: str) -> KernelTable:
    if spec not in _TABLES:
        try:
            _TABLES[spec] = load(spec)
        except KernelSpecError as exc:
            raise KernelError(str(exc)) from None
    return _TABLES[spec]


def substitute(spec: str | None, api_type: str, api_name: str, resolved: Any) -> Any:
    """The resolved API with the user's kernel as the device side, or unchanged when not mapped."""
    if not spec:
        return resolved
    found = table(spec).kernel(f"{api_type}.{api_name}")
    if found is None:
        return resolved
    fn, name = found
    return dataclasses.replace(resolved, device_fn=fn, label=f"{name} (substituted)", reference_vs_reference=False,
                               kernel=name)


__all__ = ["KernelError", "KernelSpecError", "KernelTable", "api_key", "key_error", "label", "load", "normalize",
           "preload", "substitute", "table"]
