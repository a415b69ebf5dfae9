"""Detection and false alarms on fused NPU ops: kernels substituted through --msprobe-kernels.

    python benchmarks/planted_fused.py DUMP_DIR_OR_JSON... [--standards strict,msprobe] [--arms a,b] [--json rows.json]

Dumps come from `python -m benchmarks.planted.fused_dump OUT --preset small|llama|large --dtype ...`.
For every dump: a clean run (the device side is the reference function in the recorded dtype), then
one run per arm of `benchmarks/planted/fused.py`, its kernels substituted as a kernel author does
(`--msprobe-kernels benchmarks.planted.fused:TABLES.<arm>`), over the items of the APIs it maps.
A bug's item counts when the bug changed it: its metrics differ from those of the bug's sound twin
(`base`: the same kernel without the bug, or the clean run; inputs are identical by seed). A sound
variant's every item counts. Printed per op and direction:
detection of effective bugs and false alarms on sound variants, per standard, and msprobe's
Layer 1 (`original`) from the same records.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.planted.fused import ARMS, BY_NAME  # noqa: E402
from benchmarks.planted_bugs import _fingerprint, _flagged, _message, dump_dtype, print_misses  # noqa: E402

SPEC = "benchmarks.planted.fused:TABLES"


def run(dump: Path, spec: str | None, standard: str, apis: set[str] | None) -> dict[str, dict[str, Any]]:
    """Every item's record (of `apis` only, when given), with the kernels of `spec` on the device side."""
    import torch

    from pytest_msprobe.check import check_entry
    from pytest_msprobe.dump.reader import load_dump
    from pytest_msprobe.settings import CheckOptions
    from pytest_msprobe.specs.loader import load_specs

    torch.set_num_threads(1)
    loaded = load_dump(dump)
    options = CheckOptions(device="cpu", standard=standard, kernels=spec)
    specs = load_specs()
    records = {}
    for name in loaded.entry_names():
        if apis is not None and ".".join(name.split(".")[:2]) not in apis:
            continue
        rec = check_entry(loaded, name, options, specs)
        records[f"{rec['api']}.{rec['direction']}"] = rec
    return records


Runs = dict[tuple[str, str, tuple[str, ...]], dict[str, dict[str, Any]]]


def cached(runs: Runs, dump: Path, name: str, standard: str, apis: set[str]) -> dict[str, dict[str, Any]]:
    """An arm's records (the clean run's for ""), run once: a sound twin's serve every bug of that twin."""
    key = (name, standard, tuple(sorted(apis)))
    if key not in runs:
        runs[key] = run(dump, f"{SPEC}.{name}" if name else None, standard, apis)
    return runs[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dumps", nargs="*")
    parser.add_argument("--standards", default="strict,msprobe")
    parser.add_argument("--arms", default=",".join(a.name for a in ARMS))
    parser.add_argument("--ops", default="", help="only these ops (comma-separated, e.g. npu_rms_norm)")
    parser.add_argument("--json", help="write every per-item row to this file")
    parser.add_argument("--report", nargs="*", default=None, metavar="ROWS_JSON",
                        help="only print the tables of rows written by earlier runs (--json), merged")
    args = parser.parse_args()
    if args.report is not None:
        merged = [row for path in args.report for row in json.loads(Path(path).read_text())]
        report(merged, list(dict.fromkeys(r["standard"] for r in merged)))
        return
    dumps: list[Path] = []
    for given in args.dumps:
        p = Path(given)
        dumps += sorted(Path(x) for x in glob.glob(str(p / "**" / "dump.json"), recursive=True)) if p.is_dir() else [p]
    standards = args.standards.split(",")
    only = {f"NPU.{o}" for o in args.ops.split(",") if o}
    rows: list[dict[str, Any]] = []
    started = time.time()
    for dump in dumps:
        label, dtype = dump.parent.name, dump_dtype(dump)
        runs: Runs = {}
        for arm in (BY_NAME[a] for a in args.arms.split(",") if a):
            apis = set(arm.table) & only if only else set(arm.table)
            if not apis:
                continue
            for s in standards:
                base, armed = (cached(runs, dump, name, s, apis) for name in (arm.base, arm.name))
                for item, rec in armed.items():
                    ref = base.get(item)
                    if rec.get("status") == "SKIP" or ref is None or ref.get("status") == "SKIP":
                        continue
                    effective = _fingerprint(rec) != _fingerprint(ref)
                    if arm.kind == "bug" and not effective:
                        continue
                    op, direction = item.split(".")[1], item.rsplit(".", 1)[1]
                    rows.append({"dump": label, "dtype": dtype, "arm": arm.name, "kind": arm.kind, "what": arm.what,
                                 "op": op, "direction": direction, "item": item, "standard": s,
                                 "effective": effective, "flagged": _flagged(rec, "status"),
                                 "layer1": _flagged(rec, "layer1_status"), "message": _message(rec)[:300]})
            print(f"# {label} {arm.name} done at {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    report(rows, standards)


def report(rows: list[dict[str, Any]], standards: list[str]) -> None:
    """Per op and direction: effective bugs detected, false alarms on sound variants."""
    def rate(sel: list[dict[str, Any]], key: str, s: str) -> str:
        chosen = [r for r in sel if r["standard"] == s]
        return f"{sum(r[key] for r in chosen)}/{len(chosen)}" if chosen else "-"

    cols = standards + ["original (L1)"]
    for kind, title in (("bug", "Detected effective bugs"), ("variant", "False alarms on sound variants")):
        sel = [r for r in rows if r["kind"] == kind]
        print(f"\n## {title}\n\n| op | direction | " + " | ".join(cols) + " |\n|" + "---|" * (2 + len(cols)))
        for op, direction in sorted({(r["op"], r["direction"]) for r in sel}):
            part = [r for r in sel if r["op"] == op and r["direction"] == direction]
            cells = [rate(part, "flagged", s) for s in standards] + [rate(part, "layer1", standards[0])]
            print(f"| {op} | {direction} | " + " | ".join(cells) + " |")
        print("\n| arm | dtype | " + " | ".join(cols) + " |\n|" + "---|" * (2 + len(cols)))
        for arm, dtype in sorted({(r["arm"], r["dtype"]) for r in sel}):
            part = [r for r in sel if r["arm"] == arm and r["dtype"] == dtype]
            cells = [rate(part, "flagged", s) for s in standards] + [rate(part, "layer1", standards[0])]
            print(f"| {arm} | {dtype[6:]} | " + " | ".join(cells) + " |")
    print_misses(rows, standards[0], 220)


if __name__ == "__main__":
    main()
