"""What checking a training step in-process costs the step (docs/how-to/check-a-training-step.md):

    python -m benchmarks bench_in_training [--workers 2] [--samples 1 10] [--steps 3] [--repeat 3] [--queue-mib 512]

The step is evals/recorded_replay.py's Llama-style decoder with a Mixtral-style MoE (bf16; forward, backward,
AdamW) at `--hidden` (default 1024: every contraction has K >= 1024) and `--seq` tokens (default 512), run
`--steps` times in one block as a training loop does (`checker.step()` between steps). Each configuration
runs in a fresh process, interleaved `--repeat` times: the loop alone, then inside
`pytest_msprobe.checking(sample=N, workers=W)` for each N. Printed per configuration (medians):

* `first step s` and `later steps s` (the median of the others): each step's own wall time (checked: until
  its last call returned, the copies and the queue's waits included); the first also waits for the workers
  to start (imports, the compiled checks' load);
* `block s`: from entering the block until its exit returned, every call checked and the files written;
* `calls`: the calls the block took, of those it saw;
* `peak RSS MiB` of the training process, and the queue's own peak (bytes held for calls not yet checked),
  to compare with the step alone plus the bound.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent


def one(sample: int, workers: int, hidden: int, seq: int, queue_mib: int, steps: int) -> dict[str, float]:
    """One configuration in this process; sample 0 runs the step alone."""
    import torch

    import pytest_msprobe
    from evals.recorded_replay import build_moe

    torch.manual_seed(0)
    sizes = {"hidden": hidden, "inner": hidden, "heads": max(1, hidden // 128), "seq": seq, "vocab": 8192}
    model, loss_fn = build_moe(torch.bfloat16, sizes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        checker = pytest_msprobe.checking(out=out, sample=sample, workers=workers, queue_bytes=queue_mib << 20,
                                          keep="none", fail=False, quiet=True) if sample else None
        if checker is not None:
            checker.__enter__()
        times = []
        for _ in range(steps):
            t1 = time.perf_counter()
            loss_fn().backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t1)
            if checker is not None:
                checker.step()
        if checker is not None:
            checker.__exit__(None, None, None)
        block_s = time.perf_counter() - t0
    later = statistics.median(times[1:]) if len(times) > 1 else float("nan")
    row = {"first_s": times[0], "later_s": later, "block_s": block_s,
           "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "model_rss_mib": base}
    if checker is not None and checker.summary is not None:
        row.update(calls=len(checker.summary.records), seen=checker.sampling().calls,
                   queue_peak_mib=checker.budget.peak / 2**20, not_checked=checker.summary.not_checked)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--samples", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--queue-mib", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child's configuration
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.one, args.workers, args.hidden, args.seq, args.queue_mib, args.steps)))
        return 0
    print(f"# {time.strftime('%Y-%m-%d')} {cpu_model()}; hidden {args.hidden}, seq {args.seq}, "
          f"workers {args.workers}, queue {args.queue_mib} MiB, {args.steps} steps per block")
    runs: dict[int, list[dict[str, float]]] = {s: [] for s in [0, *args.samples]}
    for _ in range(args.repeat):
        for sample in runs:
            cmd = [sys.executable, "-m", "benchmarks.bench_in_training", "--one", str(sample), "--workers",
                   str(args.workers), "--hidden", str(args.hidden), "--seq", str(args.seq), "--queue-mib",
                   str(args.queue_mib), "--steps", str(args.steps)]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
            runs[sample].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| configuration | first step s | later steps s | block s | calls (of seen) | peak RSS MiB | queue peak MiB |\n"
          "|---|---|---|---|---|---|---|")
    for sample, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        what = "alone" if sample == 0 else f"sample={sample}"
        calls = f"{med['calls']:.0f} ({med['seen']:.0f})" if sample else "-"
        queue = f"{med['queue_peak_mib']:.0f}" if sample else "-"
        print(f"| {what} | {med['first_s']:.2f} | {med['later_s']:.2f} | {med['block_s']:.2f} | {calls} | "
              f"{med['rss_mib']:.0f} | {queue} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
