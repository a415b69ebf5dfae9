"""A breadth corpus: torch's own OpInfo sample inputs recorded by msprobe's dumper on CPU.

Runs in the msprobe venv (see make_dumps.py; OpInfo also needs `pip install expecttest`):

    MSPROBE_VENV/bin/python -m benchmarks make_opinfo_dump --out DUMPS [--dtypes fp32,bf16,fp16]
           [--samples 3] [--method-samples 2] [--only 'linalg.*']

Why: the model dumps cover the few dozen APIs a training step uses; a checker also meets the
hundreds of others. Every sample here runs on torch's own CPU kernels, so every recorded call is
correct and a failing verdict on one is a false alarm.

For each dtype, one child process (msprobe's debugger is a process-wide singleton) takes every
OpInfo of `op_db` that supports the dtype on CPU, builds up to `--samples` small samples (at most
65,536 input elements each) for its function and up to `--method-samples` for its Tensor method
and in-place variants (`Tensor.add`, `Tensor.add_`: real dumps are full of them), and keeps those
that run and give the same result twice (random and uninitialised outputs are left out, and so
are ops that need randomness by name). Then it
records the kept calls with `PrecisionDebugger` (task statistics, level L1, step 0, rank 0) into
`OUT/opinfo_<dtype>/step0/rank0/dump.json`. A sample that raises under the dumper is skipped.
`OUT/opinfo_<dtype>/opinfo_report.json` lists, per OpInfo, the samples recorded and why others
were left out.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_ELEMENTS = 65536
MAX_TRIED = 12          # samples looked at per op and dtype, to bound sample-generation time
# Ops whose result is random or uninitialised by design: a second run cannot reproduce them.
RANDOM_NAME = re.compile(r"(^|[._])(rand\w*|normal|bernoulli|\w*dropout\w*|multinomial|uniform|exponential"
                         r"|geometric|cauchy|\w*empty\w*|poisson|rrelu)($|[._])")


def tensors(value: Any) -> Iterator[Any]:
    import torch
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


def same(a: Any, b: Any) -> bool:
    """Bitwise-equal results (NaN equal to NaN): a deterministic op gives the same twice."""
    import torch
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and (a.is_sparse or torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))))
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return bool(a == b)


def pick(op: Any, fn: Any, dtype: Any, n: int, inplace: bool) -> tuple[list[Any], list[str]]:
    """Up to n small samples on which fn runs and gives the same result twice.

    Returns (input, args, kwargs) triples ready to call (an in-place variant gets a fresh clone,
    made here so that the clone is not recorded) and the reasons the other samples were left out.
    """
    picked: list[Any] = []
    why: list[str] = []

    def run(s: Any) -> Any:
        x = s.input.clone() if inplace else s.input
        return fn(x, *s.args, **s.kwargs)
    try:
        for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
            if len(picked) >= n or i >= MAX_TRIED:
                break
            if sum(t.numel() for t in tensors([s.input, s.args, s.kwargs])) > MAX_ELEMENTS:
                why.append(f"sample {i}: too large")
                continue
            try:
                first, second = run(s), run(s)
            except Exception as exc:  # noqa: BLE001 - the op refuses this sample: nothing to record
                why.append(f"sample {i}: raises {type(exc).__name__}")
                continue
            try:
                reproducible = same(first, second)
            except Exception:  # noqa: BLE001 - results that cannot be compared cannot be judged either
                reproducible = False
            if not reproducible:
                why.append(f"sample {i}: not reproducible")
                continue
            picked.append((s.input.clone() if inplace else s.input, s.args, s.kwargs))
    except Exception as exc:  # noqa: BLE001 - OpInfo's own generator fails
        why.append(f"sample generation raises {type(exc).__name__}: {str(exc)[:80]}")
    return picked, why


def child(dtype_name: str, out: Path, n_samples: int, n_method: int, only: str) -> None:
    """Pick samples, check them without the dumper, then record them with it."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    dump_path = out / f"opinfo_{dtype_name}"
    cfg = {"task": "statistics", "dump_path": str(dump_path), "rank": [], "step": [0], "level": "L1",
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
    cfg_path = out / f".opinfo_{dtype_name}.config.json"
    cfg_path.write_text(json.dumps(cfg))
    # The debugger wraps torch's functions when it is created; OpInfo keeps references to the
    # functions it finds at import, so it must be imported after this to see the wrapped ones.
    # Nothing is recorded until start().
    debugger = PrecisionDebugger(config_path=str(cfg_path))
    from torch.testing._internal.common_methods_invocations import op_db

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    torch.manual_seed(0)
    report: dict[str, Any] = {}
    calls: list[tuple[str, Any, Any, tuple[Any, ...], dict[str, Any]]] = []
    for op in op_db:
        key = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
        if not fnmatch.fnmatch(key, only) or key in report:
            continue
        if RANDOM_NAME.search(op.name):
            report[key] = {"skipped": "random or uninitialised output"}
            continue
        if dtype not in op.supported_dtypes("cpu"):  # type: ignore[no-untyped-call]  # OpInfo is unannotated
            continue
        report[key] = {}
        variants = [("function", op.op, n_samples), ("method", op.method_variant, n_method),
                    ("inplace", op.inplace_variant, n_method)]
        for label, fn, n in variants:
            if fn is None or n == 0:
                continue
            picked, why = pick(op, fn, dtype, n, inplace=label == "inplace")
            calls += [(f"{key}:{label}", fn, *c) for c in picked]
            report[key][label] = {"samples": len(picked), "left_out": why}

    debugger.start(rank_id=0)
    for where, fn, x, args, kwargs in calls:
        try:
            fn(x, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the dumper itself broke on this sample
            key, label = where.rsplit(":", 1)
            report[key][label]["samples"] -= 1
            report[key][label]["left_out"].append(f"raises under the dumper: {type(exc).__name__}: {str(exc)[:80]}")
    debugger.stop()
    debugger.step()
    cfg_path.unlink()
    (dump_path / "opinfo_report.json").write_text(json.dumps(report, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where the opinfo_<dtype> dump folders go")
    ap.add_argument("--dtypes", default="fp32,bf16,fp16")
    ap.add_argument("--samples", type=int, default=3, help="samples per OpInfo and dtype (function variant)")
    ap.add_argument("--method-samples", type=int, default=2,
                    help="samples of the Tensor method and in-place variants (0: none)")
    ap.add_argument("--only", default="*", help="glob on OpInfo names (name.variant), e.g. 'linalg.*'")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.out, args.samples, args.method_samples, args.only)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for dt in args.dtypes.split(","):
        target = args.out / f"opinfo_{dt}"
        if target.exists():
            subprocess.run(["rm", "-rf", "--", str(target)], check=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", dt, "--out", str(args.out),
                               "--samples", str(args.samples),
                               "--method-samples", str(args.method_samples), "--only", args.only],
                              check=False, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        seconds = time.perf_counter() - t0
        dump = target / "step0" / "rank0" / "dump.json"
        if proc.returncode != 0 or not dump.is_file():
            failed += 1
            print(f"opinfo_{dt}: rc={proc.returncode}\n{proc.stderr[-3000:]}", flush=True)
            continue
        data = json.loads(dump.read_text())["data"]
        apis = {k.rsplit(".", 2)[0] for k in data}
        report = json.loads((target / "opinfo_report.json").read_text())
        ops = sum(1 for r in report.values() if any(v.get("samples") for v in r.values() if isinstance(v, dict)))
        print(f"opinfo_{dt}: {len(data)} calls, {len(apis)} APIs, {ops} OpInfos with samples, "
              f"{dump.stat().st_size / 2**20:.1f} MiB, {seconds:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
