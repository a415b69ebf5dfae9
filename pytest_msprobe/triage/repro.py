"""`--msprobe-repro DIR`: one Python script per failing item, which reruns it with the plugin's own check.

The check logic is written once. A script holds the item's inputs as its check built them (after
msprobe's dtype fixes and HF32 rounding; a backward item's recorded gradients too) in the form of
saved error data (`errordata.inputs_in_memory`: dump entries whose tensors have data names), the
check options and the numbers the item reported. Run, it writes them as a one-item `task: tensor`
dump in a temporary folder and calls `pytest_msprobe.check.check_entry` on it, the function every
item runs: the device call, the bench, the third run and the standard's verdict are the plugin's.
So it needs pytest-msprobe installed (torch_npu on an NPU host, the `--msprobe-kernels` module when
the item substituted a kernel).

* Up to `EMBED_LIMIT` bytes of tensors are embedded (a base64 `torch.save` blob); larger ones go to
  `<script>.pt` beside the script, loaded with `weights_only=True`.
* It prints the failure table the item printed, then compares every number of the new record with
  the item's (per output: Layer-1 metrics, the worst element, the standard's statistics and
  comparison cells, status and verdict; the item's status) and says whether they are the same;
  `--json` prints the record as one JSON object. Exit status 1 when the verdict is `error`, so the
  script doubles as the check of a fix.

The worker that ran the item writes its script (unique name per item), so nothing is shared.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import io
import json
import math
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..records.record import Record

EMBED_LIMIT = 256 * 1024  # bytes of tensor data embedded in the script; the rest goes to <script>.pt
# what the script compares per output: everything the item's verdict rests on
COMPARED = ("status", "verdict", "algorithm", "device_dtype", "bench_dtype", "shape", "metrics", "worst",
            "reference", "compare")


def script_name(nodeid: str) -> str:
    """A file name per item: the dump folder and the entry, e.g. `step0_rank0__Functional.gelu.0.forward.py`."""
    from .errordata import node_folder

    path, _, entry = nodeid.rpartition("::")
    folder = node_folder(path).as_posix().strip("./")
    stem = f"{folder}__{entry}" if folder else entry
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", stem).strip("_") + ".py"


@dataclasses.dataclass(frozen=True)
class RedItem:
    """What a failed item leaves for its repro: its dump and entry, its node id, what its check stashed (the
    inputs, the plan) and its record."""

    dump: Any
    entry_name: str
    nodeid: str
    captured: Mapping[str, Any]
    record: Record


def build_spec(item: RedItem, options: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(SPEC, tensors by data name) of one item from what its check stashed; None without inputs."""
    from .errordata import inputs_in_memory

    dump, entry_name, captured, record, nodeid = item.dump, item.entry_name, item.captured, item.record, item.nodeid
    saved = inputs_in_memory(dump, entry_name, captured)
    if saved is None:
        return None
    entries, tensors = saved
    spec = {
        "item": nodeid, "entry": entry_name, "entries": entries, "options": dataclasses.asdict(options),
        "expected": {"status": record.status, "seed": record.seed, "device": record.device,
                     "outputs": [{k: getattr(out, k) for k in ("name", *COMPARED)} for out in record.outputs]},
    }
    return spec, tensors


def render(spec: Mapping[str, Any], tensors: Mapping[str, Any], script: Path) -> str:
    """The script's text; tensors beyond EMBED_LIMIT are written to `<script>.pt` beside it."""
    import torch

    small, large = {}, {}
    budget = EMBED_LIMIT
    for key, t in tensors.items():
        size = t.numel() * t.element_size()
        if size <= budget:
            small[key], budget = t, budget - size
        else:
            large[key] = t
    blob = ""
    if small:
        buffer = io.BytesIO()
        torch.save(small, buffer)
        blob = base64.b64encode(buffer.getvalue()).decode("ascii")
    tensors_file = None
    if large:
        tensors_file = script.with_suffix(".pt").name
        torch.save(large, script.with_suffix(".pt"))
    spec_json = json.dumps(spec, indent=1, allow_nan=True, ensure_ascii=False)
    if "'''" in spec_json:
        spec_literal = f"json.loads(base64.b64decode({base64.b64encode(spec_json.encode()).decode()!r}))"
    else:
        spec_literal = f"json.loads(r'''{spec_json}''')"
    blob_lines = "\n".join(f"    {blob[i:i + 100]!r}" for i in range(0, len(blob), 100)) or "    ''"
    options, expected = spec["options"], spec["expected"]
    return f'''#!/usr/bin/env python3
"""Reproducer of {spec["entry"]}, written by pytest-msprobe --msprobe-repro.

Item:     {spec["item"]}
Reported: {expected["status"]} under the `{options["standard"]}` standard (seed {expected["seed"]}, device {expected["device"]})

Run:  python {script.name}               # prints the numbers and the verdict; exit status 1 on error
      python {script.name} --device cpu  # another device under test
      python {script.name} --json        # the item's record as one JSON object
It runs pytest-msprobe's own check (pytest_msprobe.check.check_entry) on the inputs below, so
pytest-msprobe must be installed. Edit SPEC (the call's entries, the options) to experiment.
"""
import base64
import json
import os
import sys

from pytest_msprobe.triage.repro import main

SPEC = {spec_literal}

TENSOR_BLOB = (
{blob_lines}
)
TENSORS_FILE = {tensors_file!r}  # larger inputs, beside this script

if __name__ == "__main__":
    sys.exit(main(SPEC, "".join(TENSOR_BLOB), TENSORS_FILE, os.path.dirname(os.path.abspath(__file__))))
'''


def write_script(folder: Path, item: RedItem, options: Any) -> Path | None:
    """Write the repro of one item; None when the check failed before its inputs existed."""
    if "plan" not in item.captured:
        return None
    built = build_spec(item, options)
    if built is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / script_name(item.nodeid)
    text = render(*built, script)
    tmp = script.with_name(f".{script.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(script)
    return script


# ----------------------------------------------------------------------------- in the script


def load_tensors(blob: str, file_name: str | None, here: str) -> dict[str, Any]:
    import torch

    tensors: dict[str, Any] = {}
    if blob:
        tensors.update(torch.load(io.BytesIO(base64.b64decode(blob)), map_location="cpu", weights_only=True))
    if file_name:
        tensors.update(torch.load(Path(here) / file_name, map_location="cpu", weights_only=True))
    return tensors


def rerun(spec: Mapping[str, Any], tensors: Mapping[str, Any], device: str | None = None) -> Record:
    """The item's record, from check_entry on its saved inputs with its options (`device` replaces its device)."""
    import torch

    from ..check import check_entry
    from ..settings import CheckOptions
    from ..specs.loader import load_specs
    from .errordata import temporary_dump

    options = CheckOptions(**{**spec["options"], "data_mode": "real"})
    if device:
        options = dataclasses.replace(options, device=device, device_index=None)
    torch.set_num_threads(options.threads)  # as every process that runs items (CPU reductions depend on it)
    specs = load_specs(user_file=options.specs_file)
    with temporary_dump(spec["entries"], tensors, prefix="msprobe_repro_") as dump:
        record = check_entry(dump, spec["entry"], options, specs)
    record.standard = options.standard
    return record


def differences(record: Record, expected: Mapping[str, Any]) -> list[str]:
    """What differs from the numbers the item reported (`expected`: the script's plain JSON; empty: the same)."""
    found = []
    if record.status != expected.get("status"):
        found.append(f"status {record.status}, item {expected.get('status')}")
    mine = {o.name: o for o in record.outputs}
    theirs = {o["name"]: o for o in expected.get("outputs") or ()}
    if list(mine) != list(theirs):
        found.append(f"outputs {list(mine)}, item {list(theirs)}")
    for name in mine.keys() & theirs.keys():
        for key in COMPARED:
            found += [f"{name} {path}: {a!r}, item {b!r}"
                      for path, a, b in _unequal(getattr(mine[name], key), theirs[name].get(key), key)]
    return found


def _unequal(a: Any, b: Any, path: str) -> list[tuple[str, Any, Any]]:
    """Leaves of two JSON-like values that differ (numbers to 1e-9 relative: BLAS sums may run in another order)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [d for k in dict.fromkeys([*a, *b]) for d in _unequal(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _unequal(x, y, f"{path}[{i}]")]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        same = a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
        return [] if same else [(path, a, b)]
    return [] if a == b else [(path, a, b)]


def _json_safe(value: Any) -> Any:
    """Strict JSON: non-finite numbers become the strings "nan", "inf" and "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def main(spec: Mapping[str, Any], blob: str, tensors_file: str | None, here: str,
         argv: Sequence[str] | None = None) -> int:
    """What a repro script runs: the item again, its numbers, and whether they are the item's."""
    from ..reports.failure import format_failure

    parser = argparse.ArgumentParser(description=f"Rerun {spec['entry']} ({spec['item']}) as pytest-msprobe ran it.")
    parser.add_argument("--device", default=None, help=f"device under test (default: {spec['options']['device']})")
    parser.add_argument("--json", action="store_true", help="print the item's record as one JSON object")
    opts = parser.parse_args(argv)
    record = rerun(spec, load_tensors(blob, tensors_file, here), opts.device)
    found = differences(record, spec["expected"])
    if opts.json:  # the comparison beside the record's own keys: no part of a record
        shown = {**record.to_dict(), "same_as_item": not found, "differences": found}
        print(json.dumps(_json_safe(shown), allow_nan=False, default=str))
    else:
        # this run again, from where it was started
        again = ["python", sys.argv[0], *(["--device", opts.device] if opts.device else [])]
        print(format_failure(record, shlex.join(again)))
        print(f"verdict: {record.status} (the item reported {spec['expected']['status']})")
        print("same numbers as the item: " + ("yes" if not found else "NO\n  " + "\n  ".join(found)))
    return 1 if record.status == "error" else 0
