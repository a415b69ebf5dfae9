"""Time to compute every metric of one 16M-element output (target: under 1 s on one core).

    OMP_NUM_THREADS=1 python -m benchmarks bench_metrics [--numel 16777216] [--repeat 3]

Layer 1 + the Layer-2 columns (standards.compare_tensor) per dtype and algorithm, from the compiled pass
(metrics/numba_kernel.py) and from numpy (metrics/vectorised.py, its oracle), and the strict standard's checks
(strict.strict_compare). Best of `repeat` after one warm-up call, in CPU time of this thread (a shared
machine's load does not count), with the cost per element.
"""
from __future__ import annotations

import argparse
import functools
import os
import time
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from pytest_msprobe.metrics import fused
from pytest_msprobe.specs.loader import load_specs
from pytest_msprobe.verdict import grid, layer2, standards, strict

CASES = [  # (device dtype, numpy storage, api whose 8.x category is used, bench dtype)
    ("torch.float32", np.float32, "gelu", np.float64),            # benchmark
    ("torch.float32", np.float32, "matmul", np.float64),          # ULP
    ("torch.float16", np.float16, "add", np.float32),             # absolute threshold
    ("torch.bfloat16", np.float32, "gelu", np.float32),           # benchmark
    ("torch.bfloat16", np.float32, "gelu", np.float64),           # benchmark, a float64 bench read in place
    ("torch.bfloat16", np.float32, "linear", np.float32),         # ULP
]


def as_run(values: np.ndarray, dtype: str) -> np.ndarray:
    """The device side as a run hands it to the checks: a bf16 output as its 16-bit storage (metrics/storage.py)."""
    if dtype != "torch.bfloat16":
        return values
    return (values.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def best(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return min(times)


def numpy_only() -> Callable[[], None]:
    """Route every pair to numpy's metrics until the returned function is called."""
    original = fused.supported
    fused.supported = lambda *args, **kwargs: False

    def restore() -> None:
        fused.supported = original

    return restore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", type=int, default=1 << 24)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    specs = load_specs()
    rng = np.random.default_rng(0)
    bench64 = rng.standard_normal(args.numel)
    print(f"{args.numel:,} elements, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    for dtype, storage, api, bench_dtype in CASES:
        bench = bench64.astype(bench_dtype)
        device = as_run(grid.round_to(bench64 * (1 + 1e-3 * rng.standard_normal(args.numel)), dtype).astype(storage),
                        dtype)
        call = functools.partial(standards.compare_tensor, "x", bench, device, bench_dtype=str(bench.dtype),
                                 device_dtype=dtype, judging=standards.Judging(api, specs))
        t = best(call, args.repeat)
        restore = numpy_only()
        try:
            t_numpy = best(call, args.repeat)
        finally:
            restore()
        algo = layer2.algorithm_for(api, dtype, specs["categories"])
        print(f"  msprobe metrics  {dtype:15} {np.dtype(bench_dtype).name:8} {algo:20} {t:6.3f} s = {t / args.numel * 1e9:5.2f} ns/element "
              f"(numpy {t_numpy / args.numel * 1e9:5.2f})")
    from pytest_msprobe.verdict.judge import element_rules

    for dtype, storage in (("torch.float32", np.float32), ("torch.bfloat16", np.float32), ("torch.float16", np.float16)):
        device = as_run(grid.round_to(bench64 * (1 + 2e-3 * rng.standard_normal(args.numel)), dtype).astype(storage),
                        dtype)
        torch_run = as_run(grid.round_to(bench64, dtype).astype(storage), dtype)
        bench = bench64.astype(np.float64 if dtype == "torch.float32" else np.float32)
        for kind in ("elementwise", "reduction", "contraction"):
            rules = element_rules(specs["thresholds"]["strict"], dtype, kind)
            extra = {"magnitude": np.abs(bench) * 8} if kind == "contraction" else {"torch_run": torch_run}
            t = best(functools.partial(strict.strict_compare, bench, device, dtype, rules,
                                       strict.Runs(kind=kind, row=1024, **extra)), args.repeat)
            print(f"  strict checks    {dtype:15} {kind:20} {t:6.3f} s = {t / args.numel * 1e9:5.2f} ns/element")

if __name__ == "__main__":
    main()
