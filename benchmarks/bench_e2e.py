"""End-to-end wall time with its split, at -n 0 and -n 2, for the shared dumps and a synthetic dump.

    python -m benchmarks bench_e2e [--entries 10000] [--workers 0 2] [--standard msprobe]

For every run: wall time of the whole `pytest` command, collection (one process), and the sums over
items of input generation, device run, bench run (forward and backward), comparison and the rest
(pytest protocol, hooks, reports: the per-item overhead). Then the largest ops by bench time with
their device time (the fp64 bench of big matmuls dominates; see README "Performance").
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "dumps"


def pytest(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=cwd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def records(out: Path) -> list[dict[str, Any]]:
    (path,) = out.glob("msprobe_records_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split(recs: list[dict[str, Any]]) -> dict[str, float]:
    parts = {"inputs": 0.0, "device": 0.0, "bench": 0.0, "compare": 0.0}
    for rec in recs:
        t = rec.get("timings") or {}
        parts["inputs"] += t.get("inputs_s", 0.0)
        parts["device"] += t.get("device_s", 0.0) + t.get("device_backward_s", 0.0)
        parts["bench"] += t.get("bench_s", 0.0) + t.get("bench_backward_s", 0.0)
        parts["compare"] += t.get("compare_s", 0.0)
    return parts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=10000)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--standard", default="msprobe")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "benchmarks", "gen_dump", str(work / "synthetic"),
                        "--entries", str(args.entries)], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        suites = {f"synthetic {args.entries}": [str(work / "synthetic" / "dump.json")]}
        if SHARED.is_dir():
            suites["shared PyTorch dumps"] = [str(p / "dump.json") for p in sorted(SHARED.iterdir()) if "_pt_" in p.name]
        print(f"{'suite':24} {'-n':>3} {'items':>6} {'wall s':>7} {'collect s':>9} {'inputs':>7} {'device':>7} "
              f"{'bench':>7} {'compare':>8} {'other':>7}  (item sums, s)")
        largest: list[dict[str, Any]] = []
        for suite, dumps in suites.items():
            collect = pytest(["--collect-only", *dumps], work)
            for n in args.workers:
                out = work / f"out-{len(largest)}-{n}"
                wall = pytest([*dumps, "-n", str(n), "--msprobe-out", str(out), "--msprobe-standard", args.standard],
                              work)
                recs = records(out)
                parts = split(recs)
                busy = wall * max(n, 1) - collect * max(n, 1)
                other = max(busy - sum(parts.values()), 0.0)
                print(f"{suite:24} {n:>3} {len(recs):>6} {wall:>7.1f} {collect:>9.2f} {parts['inputs']:>7.1f} "
                      f"{parts['device']:>7.1f} {parts['bench']:>7.1f} {parts['compare']:>8.1f} {other:>7.1f}")
                if n == args.workers[0]:
                    largest += recs
        print("\nlargest ops by bench time (forward + backward), seconds:")
        largest.sort(key=lambda r: -((r.get("timings") or {}).get("bench_s", 0) + (r.get("timings") or {}).get("bench_backward_s", 0)))
        for rec in largest[:8]:
            t = rec.get("timings") or {}
            bench = t.get("bench_s", 0) + t.get("bench_backward_s", 0)
            device = t.get("device_s", 0) + t.get("device_backward_s", 0)
            print(f"  {rec['api']}.{rec['direction']:9} bench {bench * 1e3:7.2f} ms  device {device * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
