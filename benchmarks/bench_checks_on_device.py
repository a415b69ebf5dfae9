"""The checks where the device output lives against the checks on the host, on one dump and one large output.

    python -m benchmarks bench_checks_on_device DUMP_JSON [--device cuda] [--out DIR] [--elements 16777216]

1. Runs pytest-msprobe on the dump twice with `--msprobe-device DEVICE -n 0`: `-o msprobe_checks_on=device` (the
   strict pass and msprobe's metric columns in torch ops on DEVICE, only the statistics and the worst elements
   coming back) and `-o msprobe_checks_on=host` (the outputs copied to the host for the compiled passes). Prints
   each run's wall time and its phase sums (`compare` per compared output element), and compares the records:
   statuses, messages and worst elements must be the same; the cosine and the three columns msprobe sums (RMSE,
   mean relative and mean ULP error) differ by their summation order only.
2. Times msprobe's metric pass on one bf16 output of ELEMENTS elements beside a float32 bench, benchmark and
   ULP columns: the compiled host pass (one thread, CPU time, from host arrays), against metrics/on_device.py on
   DEVICE (wall time, synchronised, the arrays already there), each the least of 5.

On a CPU (`--device cpu`) the torch passes are much slower than the compiled ones; the path is meant for an
accelerator. Every figure names the CPU and the accelerator.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_model
from pytest_msprobe.metrics.on_device import SUMMED_COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def run(dump: str, device: str, where: str, out: Path) -> tuple[float, list[dict[str, Any]]]:
    """(wall seconds, records) of one run with the checks on `where`."""
    folder = out / where
    installed = any(e.name == "msprobe" for e in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "pytest_msprobe.plugin"]  # a checkout not installed (an accelerator host)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", dump, "-q", "-p", "no:cacheprovider", *plugin,
                           "--msprobe-device", device, "-o", f"msprobe_checks_on={where}", "--msprobe-out", str(folder)],
                          cwd=ROOT, check=False, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                           os.environ.get("PYTHONPATH")]))})
    wall = time.perf_counter() - began
    found = sorted(folder.glob("msprobe_records_*.jsonl"))
    if not found:
        sys.exit(f"the run with the checks on {where} wrote no records:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    records = found[-1]
    return wall, [json.loads(line) for line in records.read_text().splitlines()]


def phases(records: list[dict[str, Any]]) -> str:
    sums: dict[str, float] = {}
    for record in records:
        for key, value in record.get("timings", {}).items():
            sums[key] = sums.get(key, 0.0) + value
    compared = sum(math.prod(o.get("shape") or [1]) for r in records for o in r["outputs"] if o.get("shape") is not None)
    return (f"inputs {sums.get('inputs_s', 0):.2f} s, device {sums.get('device_s', 0) + sums.get('device_backward_s', 0):.2f}"
            f" s, bench {sums.get('bench_s', 0) + sums.get('bench_backward_s', 0):.2f} s, reference "
            f"{sums.get('reference_s', 0) + sums.get('reference_backward_s', 0):.2f} s, checks {sums.get('compare_s', 0):.2f}"
            f" s = {sums.get('compare_s', 0) / max(compared, 1) * 1e9:.2f} ns per compared element ({compared:,})")


def compare(host: list[dict[str, Any]], device: list[dict[str, Any]]) -> list[str]:
    """What differs between the two runs' records, beyond the summed columns' last digits."""
    by = {(r["api"], r["direction"]): r for r in host}
    lines, spread = [], {k: 0.0 for k in SUMMED_COLUMNS}
    outputs = 0
    for record in device:
        other = by[(record["api"], record["direction"])]
        if (record["status"], record.get("layer1_status")) != (other["status"], other.get("layer1_status")):
            lines.append(f"status differs: {record['api']} {record['direction']}")
        for a, b in zip(other["outputs"], record["outputs"]):
            outputs += 1
            for key in ("status", "message", "worst", "verdict"):
                if json.dumps(a.get(key)) != json.dumps(b.get(key)):
                    lines.append(f"{key} differs: {record['api']} {record['direction']} {a['name']}")
            for key in SUMMED_COLUMNS:
                x, y = a["metrics"].get(key), b["metrics"].get(key)
                if isinstance(x, float) and isinstance(y, float) and x != y:
                    spread[key] = max(spread[key], abs(x - y) / max(abs(x), 1e-300))
    lines.append(f"{len(device)} records, {outputs} outputs; largest relative difference: " +
                 ", ".join(f"{k} {v:.1e}" for k, v in spread.items()))
    return lines


def metric_pass(elements: int, device: str) -> list[str]:
    import numpy as np
    import torch

    from pytest_msprobe.check.compare import stored
    from pytest_msprobe.metrics import fused, on_device

    torch.set_num_threads(1)
    on = torch.device(device)
    bench = torch.randn(elements, generator=torch.Generator().manual_seed(0))
    out = (bench * (1 + 2 ** -8 * torch.randint(-1, 2, (elements,), generator=torch.Generator().manual_seed(1))))
    out = out.bfloat16()
    b, d = bench.numpy(), stored(out)[1]
    b_on, d_on = bench.to(on), out.to(on)
    f32 = np.dtype(np.float32)
    lines = []
    for name, ulp in (("benchmark columns", None), ("ULP columns", (7, -126, 1.0))):
        limits = fused.Limits(2 ** -8, 2 ** -10, 2 ** -16, 0.0, (0.01, 0.001, 0.0001), ulp, False)

        def host(limits: Any = limits) -> Any:
            return fused.compute(b, d, f32, limits, f32)

        def there(limits: Any = limits) -> Any:
            stats = on_device.compute(b_on, d_on, f32, limits, f32)
            if on.type == "cuda":
                torch.cuda.synchronize()
            return stats

        timings = {}
        for label, fn, clock in (("host", host, time.thread_time), (device, there, time.perf_counter)):
            fn()
            best = math.inf
            for _ in range(5):
                began = clock()
                fn()
                best = min(best, clock() - began)
            timings[label] = best / elements * 1e9
        same = host().worst == there().worst
        lines.append(f"| {name} | {timings['host']:.2f} | {timings[device]:.3f} | {'yes' if same else 'NO'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="/tmp/bench_checks_on_device")
    parser.add_argument("--elements", type=int, default=1 << 24)
    args = parser.parse_args()
    import torch

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"# CPU: {cpu_model()}; device: {name}; torch {torch.__version__}")
    out = Path(args.out)
    walls, records = {}, {}
    for where in ("device", "host"):
        walls[where], records[where] = run(args.dump, args.device, where, out)
        print(f"checks on {where}: wall {walls[where]:.1f} s; {phases(records[where])}")
    for line in compare(records["host"], records["device"]):
        print(f"  {line}")
    print(f"\n| one {args.elements:,}-element bf16 output | host pass ns/el (CPU time) | on {args.device} ns/el (wall) |"
          " same worst element |\n|---|---:|---:|---|")
    for line in metric_pass(args.elements, args.device):
        print(line)


if __name__ == "__main__":
    main()
