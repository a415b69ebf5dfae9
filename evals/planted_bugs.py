"""Detection and false alarms of the standards on planted kernel bugs and correct variants, end to end.

    python -m evals planted_bugs DUMP_DIR_OR_JSON... [--standards strict,msprobe] [--arms a,b] [--json FILE]
           [--checks-on auto|device|host]
    python -m evals planted_bugs DUMP_DIR_OR_JSON... --fuzz N [--arms ...] [--workers K]
    python -m evals planted_bugs DUMP_DIR_OR_JSON... --arms cuda-sincos,not-implemented [--contract NAME]

For every dump, one clean run (torch's own CPU kernels) and one run per arm of
`evals/planted/arms.py`, the arm armed inside the device-call boundary by
`evals/planted/plugin.py` for the dump's dtype only. An item counts as *effective* when the arm
changed its output (its metrics differ from the clean run's: inputs are identical by seed). Printed:
detection of effective bugs per dtype and kind, and false alarms on clean runs and on the correct
variants' effective items. `original` (msprobe's Layer 1) is read from every run's records.

`--fuzz N` hunts false alarms instead: every forward call of each dump is fuzzed (`--msprobe-fuzz N`,
hypothesis draws at the edges of the recorded statistics) on torch's own kernels and on each correct
variant among `--arms`, under `strict`, in a pytest subprocess (`-n K`); each failing `[fuzz]` item
is a false alarm, printed with its shrunk example.

The accelerator-like arms (`evals/planted/accelerator/`: correct kernels computing as CUDA's do)
get a table of their own per dump and dtype: effective items and how many the standards flag (false
alarms). Its `not-implemented` arm (kind "unsupported": the device has no kernel for the dtype) counts
"skip (not implemented)" as the right outcome and an error or failure as a wrong one. `--contract NAME`
checks under that vendor contract (`--msprobe-contract`).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import sys
import time
from pathlib import Path
from typing import Any

from evals.planted.accelerator import ACCELERATOR_ARMS
from evals.planted.arms import ARMS
from evals.planted.records import (
    FLOAT_DTYPES,
    api_keyword,
    dump_dtype,
    fingerprint,
    flagged,
    print_misses,
    record_message,
    reference_stats,
)
from evals.planted.registry import BY_NAME

ROOT = Path(__file__).resolve().parents[1]

ACCELERATOR = {arm.name for arm in ACCELERATOR_ARMS}


def run(dump: Path, arm: Any, standard: str, dtype: str, keyword: str | None, checks_on: str = "auto",
        contract: str | None = None) -> dict[str, dict[str, Any]]:
    """Check every item of the dump (those matching `keyword` when given) with `arm` armed inside the
    device-call boundary; the records by item. In-process: the same check_entry the plugin's items run."""
    import torch

    from evals.planted.mode import armed_mode
    from pytest_msprobe.check import check_entry
    from pytest_msprobe.dump.reader import load_dump
    from pytest_msprobe.runs import backends
    from pytest_msprobe.settings import CheckOptions
    from pytest_msprobe.specs.loader import load_specs

    torch.set_num_threads(1)
    loaded = load_dump(dump)
    extra: dict[str, Any] = {"contract": contract} if contract else {}
    options = CheckOptions(device="cpu", standard=standard, checks_on=checks_on, **extra)
    specs = load_specs()
    plain = backends.device_call
    torch_dtype = getattr(torch, dtype.split(".")[1])

    def armed(item_name: str, api: str, phase: str, device: Any, impl: str, fn: Any) -> Any:
        if arm is None or phase != "forward":
            return plain(item_name, api, phase, device, impl, fn)
        with armed_mode(arm, torch_dtype):
            return plain(item_name, api, phase, device, impl, fn)

    words = keyword.split(" or ") if keyword else None
    records = {}
    backends.device_call = armed
    try:
        for name in loaded.entry_names():
            if words is not None and not any(w in name for w in words):
                continue
            rec = check_entry(loaded, name, options, specs).to_dict()  # scored as the files hold it
            records[f"{rec['api']}.{rec['direction']}"] = rec
    finally:
        backends.device_call = plain
    pool_failures(records, standard, specs)
    return records


def pool_failures(records: dict[str, dict[str, Any]], standard: str, specs: Any) -> None:
    """Mark the calls of every pool that fails (verdict/pooled.py: an API's calls that each passed alone, judged
    together as the session does on its controller) with the pool's message under "pooled"."""
    from pytest_msprobe.records.record import Record
    from pytest_msprobe.verdict import pooled

    typed = [Record.from_dict(rec) for rec in records.values()]
    for verdict in pooled.failed(typed, specs, standard):
        for call in verdict.pool.calls:
            key = f"{call}.{verdict.pool.direction}"
            records[key]["pooled"] = f"{verdict.pool.name}: {verdict.message}"


def fuzz(dump: Path, arm: Any, dtype: str, examples: int, workers: int,
         contract: str | None = None) -> dict[str, str | None]:
    """The `[fuzz]` items of the dump's forward calls on correct kernels (torch's own, or the variant `arm`
    inside the device-call boundary): {item: None if it passed, else its failure text}."""
    import os
    import subprocess
    import tempfile
    import xml.etree.ElementTree as ElementTree

    with tempfile.TemporaryDirectory(prefix="fuzz-") as out:
        junit = Path(out) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", str(dump.resolve()), "-m", "fuzz", "--msprobe-fuzz", str(examples),
               "--msprobe-standard", "strict", "--msprobe-device", "cpu", "--msprobe-out", out, "-q",
               "-p", "no:cacheprovider", "-p", "evals.planted.plugin", "--junitxml", str(junit),
               "-n", str(workers), "--rootdir", out]
        if contract:
            cmd += ["--msprobe-contract", contract]
        keyword = api_keyword(arm) if arm is not None else None
        if keyword:
            cmd += ["-k", keyword]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "PLANTED_ARM": arm.name if arm is not None else "", "PLANTED_DTYPE": dtype}
        subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, check=False)
        if not junit.is_file():
            raise SystemExit(f"fuzzing {dump} wrote no JUnit XML: {' '.join(cmd)}")
        found: dict[str, str | None] = {}
        for case in ElementTree.parse(junit).iter("testcase"):
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if case.find("skipped") is None:
                found[case.get("name", "")] = None if problem is None else (problem.text or problem.get("message", ""))
        return found


def fuzz_report(rows: list[dict[str, Any]]) -> None:
    print("\n## False alarms found by fuzzing correct kernels (strict)\n")
    print("| kernels | dtype | fuzz items failing |\n|---|---|---|")
    for arm, dtype in sorted({(r["arm"], r["dtype"]) for r in rows}):
        part = [r for r in rows if r["arm"] == arm and r["dtype"] == dtype]
        print(f"| {arm} | {dtype[6:]} | {sum(r['flagged'] for r in part)}/{len(part)} |")
    for r in rows:
        if r["flagged"]:
            print(f"- {r['arm']} {r['dump']} {r['item']}: {r['message'][:600]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dumps", nargs="+", help="dump.json files or folders holding them")
    parser.add_argument("--standards", default="strict")
    parser.add_argument("--arms", default=",".join(a.name for a in ARMS))
    parser.add_argument("--json", help="write every per-item result to this file")
    parser.add_argument("--fuzz", type=int, default=0, metavar="N",
                        help="fuzz every forward call with N examples on torch's kernels and the correct variants "
                             "among --arms (strict), instead of planting bugs")
    parser.add_argument("--workers", type=int, default=2, help="xdist workers of the --fuzz runs")
    parser.add_argument("--checks-on", default="auto", choices=("auto", "device", "host"),
                        help="as ini msprobe_checks_on: device runs strict's checks in torch ops on the CPU")
    parser.add_argument("--contract", help="as --msprobe-contract: the vendor contract the checks allow for")
    args = parser.parse_args()
    if args.contract:
        import dataclasses

        from pytest_msprobe.settings import CheckOptions
        if "contract" not in {f.name for f in dataclasses.fields(CheckOptions)}:
            raise SystemExit("--contract: this checker has no contract option yet")
    dumps = []
    for given in args.dumps:
        p = Path(given)
        dumps += sorted(Path(x) for x in glob.glob(str(p / "**" / "dump.json"), recursive=True)) if p.is_dir() else [p]
    standards = args.standards.split(",")
    arms = [BY_NAME[a] for a in args.arms.split(",") if a]
    rows: list[dict[str, Any]] = []
    costs: list[tuple[str, float, float, float]] = []
    started = time.time()
    for dump in dumps:
        label = dump.parent.parent.parent.name if dump.parent.name.startswith("rank") else dump.parent.name
        # an autocast step (make_dumps.py names it so) computes its kernels in the autocast dtype
        dtype = "torch.bfloat16" if "autocastbf16" in label else "torch.float16" if "autocastfp16" in label \
            else dump_dtype(dump)
        if args.fuzz:
            for arm in [None] + [a for a in arms if a.kind == "variant"
                                 and getattr(__import__("torch"), dtype.split(".")[1]) in a.dtypes]:
                for item, failure in fuzz(dump, arm, dtype, args.fuzz, args.workers, args.contract).items():
                    rows.append({"dump": label, "dtype": dtype, "arm": arm.name if arm else "torch's own",
                                 "kind": "fuzz", "item": item, "standard": "strict", "flagged": failure is not None,
                                 "message": " ".join((failure or "").split())})
                print(f"# {label} fuzz {arm.name if arm else 'clean'} done at {time.time() - started:.0f} s",
                      file=sys.stderr, flush=True)
            continue
        clean = {s: run(dump, None, s, dtype, None, args.checks_on, args.contract) for s in standards}
        base = clean[standards[0]]
        spent: collections.Counter[str] = collections.Counter()
        for rec in base.values():
            for key, value in (rec.get("timings") or {}).items():
                spent["third" if key.startswith("reference") else key.removesuffix("_backward_s").removesuffix("_s")] \
                    += value
        costs.append((label, spent["bench"], spent["third"], spent["device"]))
        for s in standards:
            for item, rec in clean[s].items():
                if rec.get("status") != "SKIP":
                    rows.append({"dump": label, "dtype": dtype, "arm": "clean", "kind": "clean", "what": "torch's own",
                                 "item": item, "standard": s, "flagged": flagged(rec, "status"),
                                 "layer1": flagged(rec, "layer1_status"), "message": record_message(rec)[:400], "stats": reference_stats(rec)})
        for arm in arms:
            if getattr(__import__("torch"), dtype.split(".")[1]) not in arm.dtypes:
                continue
            for s in standards:
                armed = run(dump, arm, s, dtype, api_keyword(arm), args.checks_on, args.contract)
                for item, rec in armed.items():
                    ref = clean[s].get(item)  # the same standard: benches differ by standard
                    if ref is None or ref.get("status") == "SKIP":
                        continue
                    if arm.kind == "unsupported":  # effective where the device raised; a skip is right
                        if (rec.get("status"), rec.get("message")) == (ref.get("status"), ref.get("message")) and \
                                repr(fingerprint(rec)) == repr(fingerprint(ref)):  # repr: a NaN metric equals itself
                            continue
                        outcome = _unsupported_outcome(rec)
                        rows.append({"dump": label, "dtype": dtype, "arm": arm.name, "kind": arm.kind,
                                     "what": arm.what, "item": item, "standard": s, "outcome": outcome,
                                     "flagged": outcome != SKIPPED, "layer1": flagged(rec, "layer1_status"),
                                     "message": record_message(rec)[:400], "stats": reference_stats(rec)})
                        continue
                    if rec.get("status") == "SKIP":
                        continue
                    if fingerprint(rec) == fingerprint(ref) or \
                            (arm.name in ACCELERATOR and repr(fingerprint(rec)) == repr(fingerprint(ref))):
                        continue  # the arm did not change this item's output (NaN metrics: by repr, for new arms)
                    rows.append({"dump": label, "dtype": dtype, "arm": arm.name, "kind": arm.kind, "what": arm.what,
                                 "item": item, "standard": s, "flagged": flagged(rec, "status"),
                                 "layer1": flagged(rec, "layer1_status"), "message": record_message(rec)[:400], "stats": reference_stats(rec)})
        print(f"# {label} ({dtype}) done at {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.fuzz:
        fuzz_report(rows)
        return
    report(rows, standards)
    accelerator_report(rows, standards)
    print("\n## Cost of the third run (clean runs, first standard)\n")
    print("| dump | bench s | third run s | third / bench | device s |\n|---|---|---|---|---|")
    for label, bench, third, device in costs:
        print(f"| {label} | {bench:.2f} | {third:.2f} | {third / bench if bench else 0:.2f} | {device:.2f} |")


def report(rows: list[dict[str, Any]], standards: list[str]) -> None:
    cols = [f"{s}" for s in standards] + ["original (L1 error/warning)"]

    def rate(sel: list[dict[str, Any]], key: str, s: str) -> str:
        chosen = [r for r in sel if r["standard"] == s]
        hits = sum(r[key] for r in chosen)
        return f"{hits}/{len(chosen)} ({100 * hits / len(chosen):.0f}%)" if chosen else "-"

    for kind, title in (("bug", "Detected effective bugs"), ("variant", "False alarms on correct variants"),
                        ("clean", "False alarms on torch's own kernels (clean runs)")):
        sel = [r for r in rows if r["kind"] == kind]
        print(f"\n## {title}\n")
        print("| " + " | ".join(["arm", "dtype"] + cols) + " |")
        print("|" + "---|" * (2 + len(cols)))
        groups = sorted({(r["arm"], r["dtype"]) for r in sel})
        for arm, dtype in groups:
            part = [r for r in sel if r["arm"] == arm and r["dtype"] == dtype]
            cells = [rate(part, "flagged", s) for s in standards] + [rate(part, "layer1", standards[0])]
            print(f"| {arm} | {dtype[6:]} | " + " | ".join(cells) + " |")
        for dtype in FLOAT_DTYPES:
            part = [r for r in sel if r["dtype"] == dtype]
            if part:
                cells = [rate(part, "flagged", s) for s in standards] + [rate(part, "layer1", standards[0])]
                print(f"| **all** | {dtype[6:]} | " + " | ".join(cells) + " |")
        if sel:
            cells = [rate(sel, "flagged", s) for s in standards] + [rate(sel, "layer1", standards[0])]
            print("| **all** | all | " + " | ".join(cells) + " |")
    print_misses(rows, standards[0], 200)


SKIPPED = "skip (not implemented)"


def _unsupported_outcome(rec: dict[str, Any]) -> str:
    """What the checker made of a call the device has no kernel for: a skip saying so is right."""
    status = rec.get("status")
    if status == "SKIP":
        return SKIPPED if "not implemented" in (rec.get("message") or "").lower() else "skip (other reason)"
    return "error" if status == "error" else "fail" if flagged(rec, "status") else "pass"


def accelerator_report(rows: list[dict[str, Any]], standards: list[str]) -> None:
    """Per accelerator-like arm, dump and dtype: effective items and how many each standard flags (false
    alarms); for the unsupported arm, how its calls came out."""
    sel = [r for r in rows if r["arm"] in ACCELERATOR]
    if not sel:
        return
    print("\n## Accelerator-like correct kernels: flagged / effective items (false alarms)\n")
    print("| arm | dump | dtype | " + " | ".join(f"{s} flagged" for s in standards) + " |")
    print("|" + "---|" * (3 + len(standards)))
    variants = [r for r in sel if r["kind"] == "variant"]
    for arm, dump, dtype in sorted({(r["arm"], r["dump"], r["dtype"]) for r in variants}):
        part = [r for r in variants if (r["arm"], r["dump"], r["dtype"]) == (arm, dump, dtype)]
        cells = [f"{sum(r['flagged'] for r in part if r['standard'] == s)}/"
                 f"{sum(r['standard'] == s for r in part)}" for s in standards]
        print(f"| {arm} | {dump} | {dtype[6:]} | " + " | ".join(cells) + " |")
    for arm in sorted({r["arm"] for r in variants}):
        cells = [f"{sum(r['flagged'] for r in variants if r['arm'] == arm and r['standard'] == s)}/"
                 f"{sum(r['arm'] == arm and r['standard'] == s for r in variants)}" for s in standards]
        print(f"| **{arm}** | all | all | " + " | ".join(cells) + " |")
    unsupported = [r for r in sel if r["kind"] == "unsupported"]
    if unsupported:
        outcomes = (SKIPPED, "skip (other reason)", "error", "fail", "pass")
        print("\n## Calls the device has no kernel for (right: skip, not implemented)\n")
        print("| arm | dump | dtype | standard | effective | " + " | ".join(outcomes) + " |")
        print("|" + "---|" * (5 + len(outcomes)))
        for arm, dump, dtype, s in sorted({(r["arm"], r["dump"], r["dtype"], r["standard"]) for r in unsupported}):
            part = [r for r in unsupported if (r["arm"], r["dump"], r["dtype"], r["standard"]) == (arm, dump, dtype, s)]
            print(f"| {arm} | {dump} | {dtype[6:]} | {s} | {len(part)} | "
                  + " | ".join(str(sum(r["outcome"] == o for r in part)) for o in outcomes) + " |")
    print("\nArms: " + "; ".join(f"`{a.name}`: {a.what}" for a in ACCELERATOR_ARMS if a.name in {r["arm"] for r in sel}))


if __name__ == "__main__":
    main()
