"""pytest nodes: a dump.json file collector and one item per recorded API call.

Collection only parses JSON (no torch), so every xdist worker collects quickly; torch is
imported by the first item that runs.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Iterator

import pytest

from .dump import Dump, DumpError, iter_leaves, load_dump, parse_entry_name
from .settings import SETTINGS_KEY
from .summary import junit_properties

RECORD_KEY = pytest.StashKey[dict]()
KNOWN_TYPES = ("Functional", "Tensor", "Torch", "NPU", "Aten", "VF", "Distributed", "MindSpeed", "Triton",
               "Mint", "MintFunctional", "MintDistributed", "Primitive", "Jit")
KNOWN_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                "int64", "uint64", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "int4")


class ApiCheckFailed(Exception):
    """Raised by an item whose verdict is error (or Warning with --msprobe-warning-as-error)."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record.get("message", ""))
        self.record = record


def dtype_marker(dtype: str) -> str:
    """torch.bfloat16 / BFloat16 -> bfloat16."""
    return dtype.rsplit(".", 1)[-1].lower()


def _entry_dtypes(entry: Any) -> list[str]:
    seen: dict[str, None] = {}
    if isinstance(entry, dict):
        for key in ("input_args", "input_kwargs", "output", "input"):
            for leaf in iter_leaves(entry.get(key)):
                if isinstance(leaf, dict) and isinstance(leaf.get("dtype"), str) and "shape" in leaf:
                    seen[dtype_marker(leaf["dtype"])] = None
    return list(seen)


class DumpFile(pytest.File):
    """A dump.json: one item per forward entry and one per backward entry."""

    def collect(self) -> Iterator[pytest.Item]:
        try:
            dump = load_dump(self.path)
        except DumpError as exc:
            raise self.CollectError(str(exc)) from None
        config = self.config
        for order, entry_name in enumerate(dump.entry_names()):
            item = ApiItem.from_parent(self, name=entry_name, order=order)
            item.add_marker("msprobe")
            try:
                parsed = parse_entry_name(entry_name)
            except ValueError:
                yield item
                continue
            markers = [parsed.api_type, parsed.direction] + _entry_dtypes(
                dump.entry(f"{parsed.full_name}.forward") or dump.entry(entry_name))
            for marker in markers:
                if not marker.isidentifier():
                    continue
                if marker not in KNOWN_TYPES and marker not in KNOWN_DTYPES:
                    config.addinivalue_line("markers", f"{marker}: msprobe API type or dtype")
                item.add_marker(marker)
            yield item

    @property
    def dump(self) -> Dump:
        return load_dump(self.path)


class ApiItem(pytest.Item):
    """One recorded API call in one direction; runs device and bench and applies the standard."""

    def __init__(self, *, order: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.order = order

    def runtest(self) -> None:
        from .check import check_entry  # torch is imported here, never at collection
        from .specs import load_specs

        settings = self.config.stash[SETTINGS_KEY]
        dump = load_dump(self.path)
        try:
            record = check_entry(dump, self.name, settings.check_options,
                                 load_specs(user_file=settings.check_options.specs_file))
        except ValueError as exc:  # unparseable entry name
            record = {"api": self.name, "direction": "", "status": "SKIP", "message": str(exc), "outputs": []}
        record.update(nodeid=self.nodeid, dump=self.path.as_posix() if not self._relpath() else self._relpath(),
                      order=self.order, standard=settings.standard, rerun=self.rerun_command())
        self.stash[RECORD_KEY] = record
        self.user_properties += junit_properties(record)  # JUnit <property> elements, also under xdist
        status = record["status"]
        if status == "SKIP":
            pytest.skip(record["message"])
        if status == "error" or (status == "Warning" and settings.warning_as_error):
            raise ApiCheckFailed(record)

    def _relpath(self) -> str:
        return self.nodeid.split("::", 1)[0]

    def rerun_command(self) -> str:
        settings = self.config.stash[SETTINGS_KEY]
        args = ["pytest", f"{self.path}::{self.name}", "--msprobe-seed", str(settings.check_options.run_seed),
                "--msprobe-device", settings.check_options.device]
        opts = settings.check_options
        args += ["--msprobe-standard", opts.standard]
        for flag, value in (("--msprobe-data-mode", None if opts.data_mode == "auto" else opts.data_mode),
                            ("--msprobe-reference", opts.reference_device),
                            ("--msprobe-reference-results", opts.reference_results),
                            ("--msprobe-specs", opts.specs_file)):
            if value:
                args += [flag, value]
        return shlex.join(args)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ApiCheckFailed):
            from .report import format_failure

            record = excinfo.value.record
            text = format_failure(record, record.get("rerun", self.rerun_command()))
            if record.get("traceback"):
                text = f"{record['traceback'].rstrip()}\n\n{text}"
            return text
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"msprobe: {self.name}"
