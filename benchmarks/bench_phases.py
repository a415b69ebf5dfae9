"""Where a run's time goes, per element: each phase's cost per generated input element and per compared
output element, on one dump, at -n 0 and -n 2.

    python benchmarks/bench_phases.py [DUMP_JSON] [--workers 0 2] [--repeat 3] [--standard strict]
           [--pytest-arg=--msprobe-threads=2 ...]

Each setting runs pytest-msprobe on the dump (`--msprobe-device cpu`), the settings interleaved round by
round so that a shared machine's load drift hits each alike; the fastest round of each is shown. For
it: wall time, CPU time and peak RSS (of the largest process, controller or worker), collection, and the
sums over items of the phases in `record["timings"]`: inputs per generated input element (the elements of
each item's recorded input tensors), the device, bench and reference runs, and the checks (`compare`) per
compared output element (the elements of every compared output). "own work" is everything but the API
runs (device, bench, reference); at -n 2 the phase sums hold both workers' time, so shares are of
2 x wall. Also: the speed-up of -n 2 over -n 0, and what a worker loses (the phase sums against 2 x wall:
start-up, idle time at the end, pytest and xdist).

Every figure names the CPU model and whether it has native bf16 (the API runs of a bf16 dump are fast
only with it, so the checker's own work shows). Measure on a quiet machine: on a shared one the CPU time
and the per-element costs are the figures to trust.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_vs_msprobe import DUMPS, load, ours  # noqa: E402
from benchmarks.verify_strict_kernel import _cpu  # noqa: E402


def _tensor_elements(node: Any) -> int:
    """Elements of every tensor recorded under a dump node (lists, dicts, tensor entries)."""
    if isinstance(node, dict):
        if "shape" in node and "dtype" in node and isinstance(node.get("shape"), list):
            return math.prod(int(s) for s in node["shape"])
        return sum(_tensor_elements(v) for v in node.values())
    if isinstance(node, list):
        return sum(_tensor_elements(v) for v in node)
    return 0


def element_counts(dump: Path, out: Path) -> tuple[int, int]:
    """(input elements generated, output elements compared) over the run's records."""
    data = json.loads(dump.read_text())["data"]
    (records,) = out.glob("msprobe_records_*.jsonl")
    generated = compared = 0
    for line in records.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        entry = data.get(f"{record['api']}.forward") or data.get(record["api"]) or {}
        generated += _tensor_elements([entry.get("input_args", []), entry.get("input_kwargs", {})])
        compared += sum(math.prod(o["shape"]) for o in record.get("outputs", []) if o.get("shape") is not None)
    return generated, compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", nargs="?", type=Path, default=next((d for d in DUMPS if d.is_file()), None))
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--standard", default="strict")
    parser.add_argument("--pytest-arg", dest="pytest_args", action="append", default=[])
    args = parser.parse_args()
    if args.dump is None or not args.dump.is_file():
        raise SystemExit("no dump: pass a dump.json")
    print(f"dump {args.dump}; CPU: {_cpu()}")
    best: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(args.repeat):
            for workers in args.workers:
                print(f"  load {load()}: -n {workers}", flush=True)
                run = ours(args.dump, args.standard, workers, work, args.pytest_args)
                out = max(work.glob(f"out-{args.standard}-{workers}-*"), key=lambda p: p.stat().st_mtime)
                run["generated"], run["compared"] = element_counts(args.dump, out)
                if workers not in best or run["wall"] < best[workers]["wall"]:
                    best[workers] = run
    for workers, run in sorted(best.items()):
        p, procs = run["phases"], max(1, workers)
        api = p["device"] + p["bench"] + p["reference"]
        own = procs * run["wall"] - api
        print(f"\n-n {workers}: wall {run['wall']:.1f} s, CPU {run['cpu']:.1f} s, peak RSS {run['rss']:.0f} MiB, "
              f"{run['items']} items, collection {run['collection']:.2f} s")
        print(f"  API runs {api:.1f} s (device {p['device']:.1f}, bench {p['bench']:.1f}, reference "
              f"{p['reference']:.1f}); own work {own:.1f} s = {own / (procs * run['wall']):.0%} of "
              f"{procs} x wall; wall / API runs {procs * run['wall'] / max(api, 1e-9):.2f}")
        print(f"  inputs {p['inputs']:.2f} s = {p['inputs'] / max(run['generated'], 1) * 1e9:.2f} ns per generated "
              f"element ({run['generated']:,}); checks {p['compare']:.2f} s = "
              f"{p['compare'] / max(run['compared'], 1) * 1e9:.2f} ns per compared element ({run['compared']:,})")
        rest = procs * run["wall"] - sum(p.values())
        print(f"  outside the phases (start-up, pytest, xdist, idle workers, reports): {rest:.1f} s")
    if 0 in best and 2 in best:
        print(f"\n-n 2 is {best[0]['wall'] / best[2]['wall']:.2f}x -n 0")


if __name__ == "__main__":
    main()
