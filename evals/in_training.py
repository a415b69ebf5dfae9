"""The in-process check against the offline one, call for call, on the recorded-replay step.

    MSPROBE_VENV/bin/python -m evals recorded_replay record --out DIR     # msprobe's own dumper
    python -m evals in_training DIR [--workers 2] [--sample 1]

`recorded_replay record` dumps one training step of its Llama-style MoE decoder (bf16, forward, backward,
AdamW) with msprobe's PrecisionDebugger (L1, task tensor): under the correct accelerator-like kernels
(DIR/accelerator) and under torch's (DIR/torch). This runs the same step, from the same seed and under the
same arms, inside `pytest_msprobe.checking(device="cuda")`, replays each msprobe dump offline with
`--msprobe-mode replay --msprobe-contract cuda`, and compares the two verdicts of every forward call both
saw. The step's backward is checked per aten op in-process and per API in the dump, so backward calls are
counted, not paired. It also times the step alone and checked (`--sample` N: one call in N per API) and reads
the training process's peak RSS. Prints a Markdown table; exit 1 when a paired verdict differs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .recorded_replay import DUMPS, ROOT, build_moe, dump_file


def _arms(which: str) -> list[Any]:
    from evals.planted.accelerator import ACCELERATOR_ARMS

    return [a for a in ACCELERATOR_ARMS if a.kind != "unsupported"] if which == "accelerator" else []


def step(which: str, checked: dict[str, Any] | None) -> tuple[float, Any]:
    """One training step as recorded_replay's child runs it, in-process checked when `checked` holds the
    keywords of checking(); (seconds, the checker or None)."""
    import torch

    import pytest_msprobe
    from evals.planted.mode import armed_mode

    torch.manual_seed(0)
    model, loss_fn = build_moe(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        for arm in _arms(which):  # below the capture: the step's calls run them, the bench never does
            stack.enter_context(armed_mode(arm, torch.bfloat16))
        checker = stack.enter_context(pytest_msprobe.checking(**checked)) if checked is not None else None
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return time.perf_counter() - t0, checker


def replayed(out: Path, which: str) -> dict[str, dict[str, Any]]:
    """The offline replay's records of msprobe's dump, by entry name."""
    results = out / f"in_training-replay-{which}"
    subprocess.run([sys.executable, "-m", "pytest", str(dump_file(out, which)), "--msprobe-mode", "replay",
                    "--msprobe-contract", "cuda", "-n", "2", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
                    "--msprobe-out", str(results)], cwd=ROOT, check=False, capture_output=True)
    (records,) = sorted(results.glob("msprobe_records_*.jsonl"))[-1:]
    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    return {f"{r['api']}.{r['direction']}": r for r in rows}


def compare(out: Path, which: str, workers: int, sample: int) -> dict[str, Any]:
    alone, _ = step(which, None)
    checked_s, checker = step(which, {"out": out / f"in_training-{which}", "workers": workers, "sample": sample,
                                      "device": "cuda", "keep": "none", "fail": False, "quiet": True})
    ours = {f"{r['api']}.{r['direction']}": r for r in checker.summary.records}
    theirs = replayed(out, which)
    paired = sorted(set(ours) & {k for k in theirs if k.endswith(".forward")})
    differ = [(k, ours[k]["status"], theirs[k]["status"], theirs[k].get("message", "")[:100]) for k in paired
              if ours[k]["status"] != theirs[k]["status"]]
    return {"dump": which, "alone_s": alone, "checked_s": checked_s, "calls": len(ours), "paired": len(paired),
            "same": len(paired) - len(differ), "differ": differ,
            "ours": Counter(r["status"] for r in ours.values()), "theirs": Counter(r["status"] for r in theirs.values()),
            "only_dump": sorted(k for k in theirs if k.endswith(".forward") and k not in ours),
            "dump_backward": sum(k.endswith(".backward") for k in theirs),
            "aten": sum(k.startswith("Aten.") for k in ours)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path, help="the folder recorded_replay record wrote")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sample", type=int, default=1)
    args = ap.parse_args(argv)
    rows = [compare(args.out.resolve(), which, args.workers, args.sample) for which in DUMPS
            if dump_file(args.out, which).is_file()]
    print("| step | alone s | checked s | calls checked (aten) | forward paired | same verdict | in-process "
          "| offline replay |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dump']} | {r['alone_s']:.2f} | {r['checked_s']:.2f} | {r['calls']} ({r['aten']}) | "
              f"{r['paired']} | {r['same']} | {dict(r['ours'])} | {dict(r['theirs'])} |")
    for r in rows:
        for name, mine, offline, message in r["differ"]:
            print(f"{r['dump']}: {name}: in-process {mine}, offline {offline} ({message})")
        if r["only_dump"]:
            print(f"{r['dump']}: forward calls in the dump only: {', '.join(r['only_dump'][:12])}"
                  f"{' ...' if len(r['only_dump']) > 12 else ''}")
        print(f"{r['dump']}: the dump's {r['dump_backward']} backward entries are checked per aten op in-process")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"training process peak RSS: {peak:.0f} MiB (workers={args.workers}, sample={args.sample})")
    return 1 if any(r["differ"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
