"""Cost per element of the strict checks of one large output: the compiled host pass, and the torch pass on
the CPU and on each accelerator torch sees (cuda, npu), interleaved round by round.

    python -m benchmarks bench_strict_device [--elements 16777216] [--row 4096] [--repeat 5]
           [--dtype torch.bfloat16] [--kinds elementwise,reduction,contraction]

The output is a bf16 (or --dtype) device result 1-2 ULPs off an fp32 bench, with a torch run (elementwise,
reduction) or a magnitude run (contraction). The host pass and the torch pass on the CPU are timed in CPU
time of one thread (torch's intra-op threads set to 1); an accelerator in wall time with the device
synchronised, its arrays already there (the device output lives there; the bench's one copy is timed apart).
Each line gives the minimum over the rounds, and whether the verdicts and messages agree.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from benchmarks.machine import cpu_model
from benchmarks.verify_strict_torch import results_agree, synchronize
from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import strict
from pytest_msprobe.verdict.judge import element_rules
from pytest_msprobe.verdict.strict import backends

ROOT = Path(__file__).resolve().parents[1]


def as_arrays(t: torch.Tensor) -> np.ndarray:
    """A tensor where strict_compare's annotation names numpy's arrays: it takes tensors too (backends.py)."""
    return cast(np.ndarray, t)


def arrays(n: int, dtype: str, kind: str) -> tuple[np.ndarray, torch.Tensor, dict[str, Any]]:
    """(fp32 bench, device output in the dtype, third run) of n elements."""
    gen = torch.Generator().manual_seed(0)
    bench = torch.randn(n, generator=gen)
    low = getattr(torch, dtype.split(".")[1])
    device = (bench * (1 + 2 ** -8 * torch.randint(-1, 2, (n,), generator=gen))).to(low)
    if kind == "contraction":
        return bench.numpy(), device, {"magnitude": bench.abs() * 4}
    return bench.numpy(), device, {"torch_run": (bench * (1 + 2 ** -9)).to(low)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--row", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dtype", default="torch.bfloat16")
    parser.add_argument("--kinds", default="elementwise,reduction,contraction")
    args = parser.parse_args()
    torch.set_num_threads(1)
    accelerators = [torch.device(k) for k in ("cuda", "npu")
                    if getattr(torch, k, None) is not None and getattr(torch, k).is_available()]
    print(f"# {args.elements:,} elements, row {args.row}, {args.dtype}; CPU: {cpu_model()}; accelerators: "
          f"{', '.join(torch.cuda.get_device_name() if a.type == 'cuda' else a.type for a in accelerators) or 'none'}")
    columns = ["kind", "host pass ns/el", "torch on cpu ns/el"] + [
        f"torch on {a.type} ns/el | bench copy to {a.type} ns/el" for a in accelerators] + ["same verdicts"]
    print("| " + " | ".join(columns) + " |")
    print("|---" * (4 + 2 * len(accelerators)) + "|")
    th = load_specs()["thresholds"]["strict"]
    for kind in args.kinds.split(","):
        rules = element_rules(th, args.dtype, kind)
        bench, device, third = arrays(args.elements, args.dtype, kind)
        host_third = {k: backends.host(v) for k, v in third.items()}
        host_device = backends.host(device)
        placed = {a: (device.to(a), {k: v.to(a) for k, v in third.items()}) for a in accelerators}
        best: dict[str, float] = {}
        agree = True
        for _ in range(args.repeat):
            t0 = time.thread_time()
            ref = strict.strict_compare(bench, host_device, args.dtype, rules, strict.Runs(kind=kind, row=args.row,
                                                                                        **host_third))
            t1 = time.thread_time()
            got = strict.strict_compare(as_arrays(torch.from_numpy(bench)), as_arrays(device), args.dtype, rules,
                                        strict.Runs(kind=kind, row=args.row, **third))
            t2 = time.thread_time()
            agree &= results_agree(got, ref)
            times = {"host": t1 - t0, "cpu": t2 - t1}
            for a, (d, extra) in placed.items():
                synchronize(a)
                t3 = time.perf_counter()
                b = torch.from_numpy(bench).to(a)
                synchronize(a)
                t4 = time.perf_counter()
                got = strict.strict_compare(as_arrays(b), as_arrays(d), args.dtype, rules,
                                            strict.Runs(kind=kind, row=args.row, **extra))
                synchronize(a)
                times[a.type], times[f"copy {a.type}"] = time.perf_counter() - t4, t4 - t3
                agree &= results_agree(got, ref)
            for key, value in times.items():
                best[key] = min(best.get(key, value), value)
        per = {k: v / args.elements * 1e9 for k, v in best.items()}
        cells = [f"{per['host']:.2f}", f"{per['cpu']:.2f}"] + [
            f"{per[a.type]:.3f} | {per[f'copy {a.type}']:.3f}" for a in accelerators]
        print(f"| {kind} | " + " | ".join(cells) + f" | {'yes' if agree else 'NO'} |")


if __name__ == "__main__":
    main()
