"""Detection and false alarms on fused NPU ops: kernels substituted through --msprobe-kernels.

    python -m evals planted_fused DUMP_DIR_OR_JSON... [--standards strict,msprobe] [--arms a,b] [--json rows.json]

Dumps come from `python -m evals fused_dump OUT --preset small|llama|large --dtype ...`.
For every dump: a clean run (the device side is the reference function in the recorded dtype), then
one run per arm of `evals/planted/fused.py`, its kernels substituted as a kernel author does
(`--msprobe-kernels evals.planted.fused:TABLES.<arm>`), over the items of the APIs it maps.
A bug's item counts when the bug changed it: its metrics differ from those of the bug's sound twin
(`base`: the same kernel without the bug, or the clean run; inputs are identical by seed). A sound
variant's every item counts. Printed per op and direction:
detection of effective bugs and false alarms on sound variants, per standard, and msprobe's
Layer 1 (`original`) from the same records.

A second effectiveness measure, printed in tables of its own next to "changed": a bug's item is
*effective beyond the sound variants* when, on at least one of its outputs, the bug's mean |error| or
its max |error| against the high-precision bench is larger than that of every sound variant of the
same op (the variant arms mapping the op; not the clean run) on the same output of the same item.
The errors are element-wise |device - bench| in fp64, counted in units of the output dtype's ULP at
the bench output's RMS (2^(floor(log2 RMS) - mantissa bits)): one unit per output, so the unit only
scales what is printed and never decides. The bench is the one of the first standard run (strict's:
fp64 for RMSNorm). The measure is none of the standards' statistics: it asks whether the bug's output
is further from the truth than a sound kernel's output can be, where "changed" asks whether it differs
from its twin's at all.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from evals.planted.fused import ARMS, BY_NAME
from evals.planted.records import dump_dtype, fingerprint, flagged, print_misses, record_message

SPEC = "evals.planted.fused:TABLES"


MANTISSA = {"torch.bfloat16": 7, "torch.float16": 10, "torch.float32": 23, "torch.float64": 52}


def distance(bench: list[Any], device: list[Any]) -> list[list[float] | None]:
    """Per compared output: [mean |device - bench|, max |device - bench|] in ULPs of the device dtype at
    the bench output's RMS (None for a non-float or empty output)."""
    out: list[list[float] | None] = []
    for b, d in zip(bench, device):
        bits = MANTISSA.get(str(getattr(d, "dtype", "")))
        if bits is None or b is None or d.numel() == 0:
            out.append(None)
            continue
        bn, dn = b.detach().double().cpu().numpy(), d.detach().double().cpu().numpy()
        same = (bn == dn) | (np.isnan(bn) & np.isnan(dn))  # equal infinities and NaN against NaN: no error
        err = np.where(same, 0.0, np.abs(dn - bn))
        err = np.where(np.isnan(err), np.inf, err)
        finite = np.isfinite(bn)
        rms = float(np.sqrt(np.mean(np.square(bn[finite])))) if finite.any() else 0.0
        unit = 2.0 ** (np.floor(np.log2(rms)) - bits) if rms > 0 else 2.0 ** (-126 - bits)
        out.append([float(err.mean() / unit), float(err.max() / unit)])
    return out


def run(dump: Path, spec: str | None, standard: str, apis: set[str] | None) -> dict[str, dict[str, Any]]:
    """Every item's record (of `apis` only, when given), with the kernels of `spec` on the device side;
    each with its `distance` to the bench under the private key "_distance"."""
    import torch

    from pytest_msprobe.check import check_entry
    from pytest_msprobe.dump.reader import load_dump
    from pytest_msprobe.runs import capture
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
        with capture.capturing() as captured:
            rec = check_entry(loaded, name, options, specs).to_dict()  # scored as the files hold it
        if "compared_bench" in captured:
            rec["_distance"] = distance(captured["compared_bench"], captured["compared_device"])
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
                    effective = fingerprint(rec) != fingerprint(ref)
                    if arm.kind == "bug" and not effective:
                        continue
                    op, direction = item.split(".")[1], item.rsplit(".", 1)[1]
                    rows.append({"dump": label, "dtype": dtype, "arm": arm.name, "kind": arm.kind, "what": arm.what,
                                 "op": op, "direction": direction, "item": item, "standard": s,
                                 "effective": effective, "flagged": flagged(rec, "status"),
                                 "layer1": flagged(rec, "layer1_status"), "message": record_message(rec)[:300]})
            print(f"# {label} {arm.name} done at {time.time() - started:.0f} s", file=sys.stderr, flush=True)
        measure_beyond([r for r in rows if r["dump"] == label], runs, standards[0])
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    report(rows, standards)


def measure_beyond(rows: list[dict[str, Any]], runs: Runs, standard: str) -> None:
    """Set each row's `distance` (its item's, see `distance`) and, on a bug's row, `sound_distance` (per
    output the largest mean and the largest max over the sound variants of the op) and `beyond` (whether
    the bug's item is effective beyond the sound variants; None when no variant of the op was run)."""
    dist: dict[tuple[str, str], Any] = {}
    for (name, s, _), records in runs.items():
        if s == standard:
            for item, rec in records.items():
                dist.setdefault((name, item), rec.get("_distance"))
    for r in rows:
        r["distance"] = dist.get((r["arm"], r["item"]))
        if r["kind"] != "bug":
            continue
        sound = [dist[(v.name, r["item"])] for v in ARMS if v.kind == "variant" and f"NPU.{r['op']}" in v.table
                 and dist.get((v.name, r["item"])) is not None]
        bug = r["distance"]
        if not sound or bug is None:
            r["sound_distance"], r["beyond"] = None, None
            continue
        worst = [None if any(v[k] is None for v in sound) else
                 [max(v[k][0] for v in sound), max(v[k][1] for v in sound)] for k in range(len(bug))]
        r["sound_distance"] = worst
        r["beyond"] = any(b is not None and w is not None and (b[0] > w[0] or b[1] > w[1])
                          for b, w in zip(bug, worst))


def report_beyond(rows: list[dict[str, Any]], standards: list[str]) -> None:
    """The detection tables over the bugs' items effective beyond the sound variants (`measure_beyond`),
    per op and direction and per bug and dump, and the items such a bug left undetected."""
    sel = [r for r in rows if r["kind"] == "bug" and r.get("beyond") is not None]
    if not sel:
        return
    cols = standards + ["original (L1)"]

    def cells(part: list[dict[str, Any]]) -> str:
        out = []
        for s, key in [(s, "flagged") for s in standards] + [(standards[0], "layer1")]:
            chosen = [r for r in part if r["standard"] == s]
            kept = [r for r in chosen if r["beyond"]]
            out.append(f"{sum(r[key] for r in kept)}/{len(kept)} of {len(chosen)}" if chosen else "-")
        return " | ".join(out)

    print("\n## Detected bugs effective beyond the sound variants (detected/beyond of changed)\n\n"
          "| op | direction | " + " | ".join(cols) + " |\n|" + "---|" * (2 + len(cols)))
    for op, direction in sorted({(r["op"], r["direction"]) for r in sel}):
        print(f"| {op} | {direction} | " + cells([r for r in sel if r["op"] == op and r["direction"] == direction])
              + " |")
    print("\n| arm | dump | " + " | ".join(cols) + " |\n|" + "---|" * (2 + len(cols)))
    for arm, dump in sorted({(r["arm"], r["dump"]) for r in sel}):
        print(f"| {arm} | {dump} | " + cells([r for r in sel if r["arm"] == arm and r["dump"] == dump]) + " |")
    print("\n| all | | " + cells(sel) + " |")
    print(f"\n## {standards[0]}: bugs' items left undetected, mean/max error in ULPs: bug against the sound "
          "variants' largest\n")
    for r in sel:
        if r["standard"] == standards[0] and not r["flagged"]:
            pairs = ", ".join("-" if b is None or w is None else f"{b[0]:.4g}/{b[1]:.4g} vs {w[0]:.4g}/{w[1]:.4g}"
                              for b, w in zip(r["distance"], r["sound_distance"]))
            print(f"- {'beyond' if r['beyond'] else 'within'} {r['arm']} {r['dump']} {r['item']}: {pairs}")


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
        print("\n| all | | " + " | ".join([rate(sel, "flagged", s) for s in standards] + [rate(sel, "layer1", standards[0])])
              + " |")
    print_misses(rows, standards[0], 220)
    report_beyond(rows, standards)


if __name__ == "__main__":
    main()
