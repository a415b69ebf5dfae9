"""The strict pass's cost per element on a real run's largest outputs, and the copies a run makes before it.

    python -m benchmarks profile_strict DUMP_JSON [--out DIR] [--repeat 7]

First it runs pytest-msprobe on the dump (`-n 0 --msprobe-device cpu`) with this file as a plugin, which saves
the arrays the strict pass reads (bench, device, third run) of the largest output of each class (device dtype,
kind, bench dtype, third run) into DIR, with the row length and the rules. Then it calls the pass on each saved
output as a run does (`verdict.strict.backends.judge_blocks`: the plan, the compiled kernel), in CPU time of this thread, the
least of `repeat` interleaved calls: as it is, with the bias test on every block (as outputs under 524,288
elements are sampled), and without the third run; and it times the copies made before the checks: torch's
widening of a bf16 output (and of the torch run) to float32 and, for msprobe's metric pass, numpy's float64
bench of a bf16 output to float32; for an fp16 output, numpy's widening to float32 and its bench rounded to fp16
and back (the metric pass's bench_dev: copies the checks avoid by reading 16-bit outputs as their storage). Every figure is ns per element, with the CPU model and native bf16.

To see what each part of the kernel costs, remove one part at a time from a copy of verdict/strict/numba_kernel.py and
call it the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, cast

import numpy as np

from benchmarks.machine import cpu_model
from pytest_msprobe.metrics.storage import widen
from pytest_msprobe.verdict.strict import backends

ROOT = Path(__file__).resolve().parents[1]

_ENV = "PROFILE_STRICT_OUT"


def pytest_configure(config: Any) -> None:
    """As a plugin: save the largest output of each class that reaches the strict pass."""
    out = os.environ.get(_ENV)
    if not out:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    kernel = backends.judge_blocks
    largest: dict[str, int] = {}

    def saving(flat: dict[str, np.ndarray], row: int, device_dtype: str, rules: Any, kind: str) -> Any:
        third = next((k for k in ("t", "mag") if k in flat), "none")
        name = f"{device_dtype[6:]}_{kind}_{flat['b'].dtype}_{third}"
        n = int(flat["d"].size)
        if n > largest.get(name, 0) and isinstance(flat["d"], np.ndarray):
            largest[name] = n
            np.savez(folder / f"{name}.npz", **cast("dict[str, Any]", flat))  # not allow_pickle's bool
            (folder / f"{name}.json").write_text(json.dumps({"row": row, "dtype": device_dtype, "kind": kind,
                                                             "rules": dict(rules)}))
        return kernel(flat, row, device_dtype, rules, kind)

    backends.judge_blocks = saving


def best(calls: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """The least CPU time of each call, the calls interleaved round by round."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeat):
        for k, call in calls.items():
            start = time.thread_time()
            call()
            times[k].append(time.thread_time() - start)
    return {k: min(v) for k, v in times.items()}


def profile(folder: Path, repeat: int) -> None:
    import torch

    torch.set_num_threads(1)
    print(f"ns per element, CPU time of one thread, least of {repeat}; {cpu_model()}")
    print(f"{'output':50} {'elements':>11} {'as run':>7} {'bias every block':>17} {'no third run':>13} "
          f"{'16-bit to fp32':>14} {'bench copy (metrics)':>20}")  # fp16: bench to fp16 and back
    for meta_file in sorted(folder.glob("*.json")):
        meta = json.loads(meta_file.read_text())
        with np.load(meta_file.with_suffix(".npz")) as saved:
            flat = {k: saved[k] for k in saved.files}
        n = flat["d"].size
        if n < 1 << 14:  # the per-call cost of tiny outputs is not a cost per element
            continue
        t = {k: v / n * 1e9 for k, v in best(_calls(flat, meta), repeat).items()}
        widen = f"{t['widen']:.2f}" if "widen" in t else "-"
        fp64 = f"{t['fp64']:.2f}" if "fp64" in t else "-"
        print(f"{meta_file.stem:50} {n:>11,} {t['as run']:>7.2f} {t['every']:>17.2f} {t['bare']:>13.2f} "
              f"{widen:>14} {fp64:>20}")


def _calls(flat: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """The calls timed for one saved output."""
    import torch

    row, dtype, kind, rules = meta["row"], meta["dtype"], meta["kind"], meta["rules"]
    bare = {k: v for k, v in flat.items() if k not in ("t", "mag", "est")}
    every_block = {**rules, "bias_max_samples": flat["d"].size + 1}
    calls: dict[str, Callable[[], Any]] = {
        "as run": lambda: backends.judge_blocks(flat, row, dtype, rules, kind),
        "every": lambda: backends.judge_blocks(flat, row, dtype, every_block, kind),
        "bare": lambda: backends.judge_blocks(bare, row, dtype, rules, kind)}
    if dtype == "torch.bfloat16":
        device = torch.from_numpy(widen(flat["d"])).bfloat16()  # the copy runs made before they read bf16 storage
        calls["widen"] = lambda: device.float()
        if flat["b"].dtype == np.float64:
            calls["fp64"] = lambda: flat["b"].astype(np.float32)
    if dtype == "torch.float16":  # numpy's widening the passes read before fp16 storage, and the metric pass's
        calls["widen"] = lambda: flat["d"].astype(np.float32)  # fp16 bench_dev (now rounded in the pass)
        calls["fp64"] = lambda: flat["b"].astype(np.float16).astype(np.float32)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dump", help="dump.json of a real run")
    parser.add_argument("--out", default="profile_strict_outputs", help="where the saved outputs go")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    out = Path(args.out).resolve()
    env = {**os.environ, _ENV: str(out), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-p", "benchmarks.profile_strict", args.dump, "-n", "0", "-q",
                    "--msprobe-device", "cpu", "--msprobe-out", str(out / "results"), "-p", "no:cacheprovider"],
                   env=env, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    profile(out, args.repeat)


if __name__ == "__main__":
    main()
