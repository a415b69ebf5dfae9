"""`python -m pytest_msprobe script 'dump.json::Functional.linear.0.forward'`: a standalone script for any
recorded call, passing or failing, as msprobe's op_generate writes one (REFERENCE §9.3), with an iteration
count (msprobe's `iter_times`).

The script carries the call and nothing else: the entry (and, for a backward item, its forward entry) as the
dump recorded it, the tensor files those entries name (embedded up to repro.EMBED_LIMIT bytes, the rest in a
folder beside the script), the run options and the user's spec file. When run, it writes that one-call dump to
a temporary folder and checks it with pytest_msprobe's own code, `check.check_entry` (imported, not copied),
`--iter-times` times: the same inputs (same seed), device and bench runs and verdicts as the pytest item, for
every kind of item (PyTorch re-run, replay of recorded outputs, MindSpore). It prints each run's verdict and
metrics, whether the runs agree, and the device time per run. `--msprobe-repro` writes such a script for
failing replay and MindSpore items, whose device side (a recorded output, MindSpore) lives in their dump;
re-run items get `repro.py`'s script, which holds the inputs as the check built them.

Torch-free until the script runs.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from ..dump.reader import Dump, DumpError, load_dump, parse_entry_name, resolve_tensor_path
from ..records.record import Record
from ..settings import CheckOptions
from .repro import EMBED_LIMIT

HEADER_KEYS = ("task", "level", "framework", "dump_data_dir")


class ScriptError(Exception):
    """The call cannot be written as a script (no such dump or entry, a tensor file missing)."""


def parse_target(target: str) -> tuple[Path, str]:
    path, sep, entry = target.rpartition("::")
    if not sep or not path or not entry:
        raise ScriptError(f"{target!r}: expected DUMP_JSON::ENTRY, e.g. 'dump.json::Functional.linear.0.forward'")
    return Path(path), entry


def one_call_dump(dump: Dump, entry: str) -> tuple[dict[str, Any], dict[str, Path]]:
    """The dump document holding only `entry` (and its forward entry) and the tensor files they name."""
    if dump.entry(entry) is None:
        import difflib

        close = difflib.get_close_matches(entry, dump.entry_names(), n=3)
        raise ScriptError(f"{dump.path}: no entry {entry}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    try:
        name = parse_entry_name(entry)
    except ValueError as exc:
        raise ScriptError(str(exc)) from None
    keys = [f"{name.full_name}.forward"] + ([entry] if name.direction == "backward" else [])
    data = {k: dump.entry(k) for k in keys if dump.entry(k) is not None}
    files: dict[str, Path] = {}

    def walk(value: Any) -> None:
        if isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            if value.get("data_name") or value.get("datapath"):
                try:
                    path = resolve_tensor_path(dump, value)
                except ValueError as exc:
                    raise ScriptError(f"{entry}: {exc}") from None
                if path is not None and path.is_file():
                    files[path.name if value.get("datapath") else str(value.get("data_name"))] = path
            for v in value.values():
                walk(v)

    walk(data)
    header = {k: v for k, v in (("task", dump.task), ("level", dump.level), ("framework", dump.framework),
                                ("dump_data_dir", dump.dump_data_dir))}
    return {**header, "data": data}, files


def write(target: str, out: Path | None, options: CheckOptions, iter_times: int = 1,
          nodeid: str | None = None) -> Path:
    """Write the script of one recorded call; returns its path."""
    if iter_times < 1:
        raise ScriptError(f"--iter-times must be at least 1, got {iter_times}")
    path, entry = parse_target(target)
    try:
        dump = load_dump(path)
    except DumpError as exc:
        raise ScriptError(str(exc)) from None
    doc, files = one_call_dump(dump, entry)
    if out is None:
        from .repro import script_name

        out = Path(script_name(nodeid or f"{path.as_posix()}::{entry}"))
    out.parent.mkdir(parents=True, exist_ok=True)
    embedded, budget, side = {}, EMBED_LIMIT, out.with_suffix(".data")
    for rel, file in sorted(files.items()):
        size = file.stat().st_size
        if size <= budget:
            embedded[rel], budget = base64.b64encode(file.read_bytes()).decode("ascii"), budget - size
        else:
            target_file = side / "dump_tensor_data" / rel
            target_file.parent.mkdir(parents=True, exist_ok=True)
            target_file.write_bytes(file.read_bytes())
    spec_text = Path(options.specs_file).read_text(encoding="utf-8") if options.specs_file else None
    opts = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name != "specs_file"}
    parts = Embedded(doc, embedded, side.name if len(embedded) < len(files) else None, entry, opts, spec_text,
                     iter_times)
    text = _render(out.name, parts, f"{path}::{entry}")
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out


def _literal(value: Any) -> str:
    text = json.dumps(value, indent=1, allow_nan=True, ensure_ascii=False)
    if "'''" in text or text.endswith("\\"):
        return f"json.loads(base64.b64decode({base64.b64encode(text.encode()).decode()!r}))"
    return f"json.loads(r'''{text}''')"


class Embedded(NamedTuple):
    """What a written script holds, in the order its last line passes it to run_embedded: the one-call dump.json,
    its tensor files (base64), the folder of those too large to embed, the entry, the options, the specs file's
    text and the runs of the call."""

    doc: Mapping[str, Any]
    files: Mapping[str, str]
    files_dir: str | None
    entry: str
    options: Mapping[str, Any]
    spec_text: str | None
    iter_times: int


def _render(name: str, parts: Embedded, source: str) -> str:
    doc, files, side, entry, options, spec_text, iter_times = parts
    files_lines = "".join(f"    {k!r}: (\n" + "".join(f"        {v[i:i + 100]!r}\n" for i in range(0, len(v), 100))
                          + "    ),\n" for k, v in files.items())
    return f'''#!/usr/bin/env python3
"""The recorded call {entry} as a standalone script, written by `python -m pytest_msprobe script`.

Source: {source}
Runs the call as its pytest item does (pytest_msprobe's own check, imported): the same inputs, device and bench
runs and verdict under the `{options["standard"]}` standard, {iter_times} time(s) (msprobe's iter_times).

Run:  python {name}    # verdict and metrics of every run; exit status 1 on error
      python {name} --iter-times 100    # repeat the call: do the runs agree, how long does the device take?
      python {name} --device cpu        # another device under test
      python {name} --json              # the records as JSON
Needs pytest-msprobe (and torch; MindSpore for MindSpore re-runs) where it runs.
"""
import base64
import json
import sys

ENTRY = {entry!r}
DUMP = {_literal(doc)}
FILES = {{  # tensor files of the call, base64
{files_lines}}}
FILES_DIR = {side!r}  # larger tensor files, beside this script
OPTIONS = {_literal(options)}
SPECS_YAML = {spec_text!r}
ITER_TIMES = {iter_times}

if __name__ == "__main__":
    from pytest_msprobe.triage.script import run_embedded

    sys.exit(run_embedded(__file__, DUMP, FILES, FILES_DIR, ENTRY, OPTIONS, SPECS_YAML, ITER_TIMES))
'''


def run_embedded(script: str, *embedded: Any, argv: list[str] | None = None) -> int:
    """The body of every written script: rebuild the one-call dump, check it `iter_times` times, report.
    `embedded` is Embedded's fields, positional, as every script written so far passes them."""
    import argparse

    doc, files, files_dir, entry, options, spec_text, iter_times = Embedded(*embedded)

    from .errordata import temporary_dump

    parser = argparse.ArgumentParser(description=f"Run {entry} as pytest-msprobe checks it.")
    parser.add_argument("--iter-times", type=int, default=iter_times, help=f"runs of the call (default {iter_times})")
    parser.add_argument("--device", default=None, help=f"device under test (default {options.get('device')})")
    parser.add_argument("--json", action="store_true", help="print the records as one JSON object")
    args = parser.parse_args(argv)
    if args.iter_times < 1:
        parser.error("--iter-times must be at least 1")
    side = Path(script).resolve().parent / files_dir / "dump_tensor_data" if files_dir else None
    on_disk = {p.relative_to(side).as_posix(): p for p in side.rglob("*") if p.is_file()} if side else {}
    blobs = {rel: base64.b64decode("".join(blob)) for rel, blob in files.items()}
    header = {k: v for k, v in doc.items() if k in HEADER_KEYS}
    with tempfile.TemporaryDirectory(prefix="msprobe-script-") as tmp, \
            temporary_dump(doc["data"], blobs, on_disk, "msprobe-script-", header) as dump:
        specs_file = None
        if spec_text is not None:
            specs_file = str(Path(tmp) / "specs.yaml")
            Path(specs_file).write_text(spec_text, encoding="utf-8")
        opts = CheckOptions(**{**options, "specs_file": specs_file, "device": args.device or options["device"]})
        records, wall_s = _runs(dump, entry, opts, args.iter_times)
    return _report(records, wall_s, entry, opts, args.json)


def _runs(dump: Dump, entry: str, opts: CheckOptions, n: int) -> tuple[list[Record], list[float]]:
    """The records of `n` checks of the call, and each check's wall time (the script's, not the record's: only
    `--json` shows it, beside its record)."""
    import torch

    from ..check import check_entry
    from ..specs.loader import load_specs

    torch.set_num_threads(opts.threads)  # CPU reductions depend on it; the item used the same number
    specs = load_specs(user_file=opts.specs_file)
    records, wall_s = [], []
    for _ in range(n):
        started = time.perf_counter()
        records.append(check_entry(dump, entry, opts, specs))
        wall_s.append(time.perf_counter() - started)
    return records, wall_s


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.8g}"
    return "-" if value is None else str(value)


def _same(a: Record, b: Record) -> bool:
    keep = ("name", "status", "verdict", "metrics", "worst")
    return a.status == b.status and [{k: getattr(o, k) for k in keep} for o in a.outputs] == \
        [{k: getattr(o, k) for k in keep} for o in b.outputs]


def _report(records: list[Record], wall_s: list[float], entry: str, opts: CheckOptions, as_json: bool) -> int:
    agree = all(_same(records[0], r) for r in records[1:])
    device_s = sorted(r.timings.get("device_s", 0.0) for r in records)
    status = "error" if any(r.status == "error" for r in records) else records[-1].status
    if as_json:
        runs = [{**r.to_dict(), "wall_s": s} for r, s in zip(records, wall_s)]
        print(json.dumps({"entry": entry, "status": status, "runs_agree": agree, "records": runs},
                         allow_nan=True, default=str))
        return 1 if status == "error" else 0
    first = records[0]
    print(f"{entry}  standard={opts.standard}  device={first.device or opts.device}  seed={first.seed}  "
          f"impl={first.impl}")
    for out in first.outputs:
        metrics = out.metrics
        numbers = "  ".join(f"{k}={_fmt(metrics[k])}" for k in ("cosine", "max_abs_err", "max_rel_err",
                                                                "dual_thousandth", "binary_error_rate")
                            if metrics.get(k) is not None)
        print(f"  {out.name}  {out.device_dtype} -> {out.verdict or out.status}  {numbers}")
        if out.verdict_message:
            print(f"    {out.verdict_message}")
    if first.message:
        print(f"  message: {first.message}")
    timing = f"; device time per run: min {_fmt(device_s[0])} s, median {_fmt(device_s[len(device_s) // 2])} s" \
        if any(device_s) else ""
    print(f"runs: {len(records)}, " + ("all agree" if agree else "RESULTS DIFFER between runs") + timing)
    print(f"verdict: {status}")
    return 1 if status == "error" else 0


__all__ = ["ScriptError", "one_call_dump", "parse_target", "run_embedded", "write"]
