"""Cost of one random input tensor drawn from a dump's statistics, per generated element, on one core.

    python -m benchmarks bench_draw [--repeat 5]                      # this tree
    python -m benchmarks bench_draw --trees OLD NEW [--rounds 3]      # two trees, interleaved A/B
    python -m benchmarks bench_draw --dump DUMP_JSON [--trees OLD NEW] # every item of a dump

Each cell builds one tensor argument (`inputs.build.build` of a statistics leaf: the draw, the scaling, the
rounding to the dtype and msprobe's planted Min/Max) with one thread, and keeps the least CPU time of this
thread over `repeat` builds after a warm-up (a shared machine's load does not count), with glibc's malloc
thresholds fixed as in a process that runs items (runs/memory.keep_freed_memory). With --trees, each
round runs this script once per tree in a fresh process (OLD, NEW, OLD, NEW, ...) and each cell keeps the
least of its rounds. OLD and NEW are source trees of pytest-msprobe (e.g. `git archive` of a commit).

With --dump, every checkable item of the dump instead: its inputs built from its seed (run seed 1234) as
check/prepare.build_inputs builds them, then the sides a run under `strict` makes of them (the device side
in the recorded dtype, the bench side in the dtypes of plan_precision, the third run's side of
runs/third_run.py: torch's run in the recorded dtype or a contraction's magnitude run; a tree whose
make_side shares inputs, runs/sharing.py, shares them as check/rerun.py does without a spare core; with one,
the bench's side is made in the helper thread and the device side copies the inputs the call writes too), each
phase's CPU time summed over items per generated input element.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

DTYPES = ("torch.bfloat16", "torch.float16", "torch.float32", "torch.float64", "torch.int64", "torch.bool")
SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 24)


def measure(repeat: int) -> dict[str, dict[str, float]]:
    """{dtype: {numel: ns per element}} for the tree this process imports pytest_msprobe from."""
    import torch

    from pytest_msprobe.inputs.build import BuildContext, build

    torch.set_num_threads(1)
    try:  # glibc's thresholds as a process that runs items sets them (freed blocks reused, not faulted again)
        from pytest_msprobe.runs.memory import keep_freed_memory
        keep_freed_memory()
    except ImportError:
        pass
    table: dict[str, dict[str, float]] = {}
    for dtype in DTYPES:
        integer = dtype in ("torch.int64", "torch.bool")
        leaf = {"type": "torch.Tensor", "dtype": dtype, "Max": 1 if dtype == "torch.bool" else 7.5 if not integer
                else 50000, "Min": 0 if integer else -2.25, "requires_grad": False}
        for numel in SIZES:
            enc = {**leaf, "shape": [numel]}
            best = math.inf
            for seed in range(repeat + 1):
                ctx = BuildContext(None, torch.Generator().manual_seed(seed), False, 1 << 34, threads=1)  # type: ignore[arg-type]
                start = time.thread_time()
                tensor = build(enc, ctx, "input_args.0")
                spent = time.thread_time() - start
                if seed:  # the first build loads the compiled code
                    best = min(best, spent)
                del tensor
            table.setdefault(dtype, {})[str(numel)] = best / numel * 1e9
    return table


def measure_dump(dump_path: str) -> dict[str, dict[str, float]]:
    """{"dump": {phase: ns per generated element}} over every checkable item of the dump."""
    import torch

    from pytest_msprobe.check.compare import warm_up
    from pytest_msprobe.check.prepare import Build, build_inputs, checkable_entries, encoded_arguments
    from pytest_msprobe.dump.reader import load_dump, parse_entry_name
    from pytest_msprobe.inputs.seeds import item_seed
    from pytest_msprobe.runs.execution import RAISABLE, Device, Target, first_output_dtype, make_side, resolve
    try:  # a tree with runs/precision.py
        from pytest_msprobe.runs.precision import Plan, PrecisionPolicy, plan_precision
    except ImportError:
        from pytest_msprobe.runs.execution import Plan, PrecisionPolicy, plan_precision  # type: ignore[attr-defined,no-redef]  # an older tree
    from pytest_msprobe.runs.third_run import RunInputs, third_run
    try:  # a tree whose sides share the inputs the call does not write
        from pytest_msprobe.runs import sharing
        from pytest_msprobe.runs.execution import Shared
    except ImportError:
        sharing = None  # type: ignore[assignment]
    from pytest_msprobe.runs.memory import keep_freed_memory
    from pytest_msprobe.settings import CheckOptions
    from pytest_msprobe.specs.loader import load_specs

    torch.set_num_threads(1)
    keep_freed_memory()
    warm_up("strict")  # the compiled passes loaded, as before a process's first item
    dump, specs, options, device = load_dump(dump_path), load_specs(), CheckOptions(device="cpu"), Device("cpu")
    spent = dict.fromkeys(("draw", "device side", "bench side", "third run's side"), 0.0)
    generated = 0
    for entry in dump.entry_names():
        try:
            name = parse_entry_name(entry)
            _, forward, backward = checkable_entries(dump, name, specs)
            args_enc, kwargs_enc = encoded_arguments(forward, name.full_name)
        except Exception:  # not checkable: not built by a run either
            continue
        marks = [time.thread_time()]
        ctx, args, kwargs, cotangents = build_inputs(Build(dump, name.api_name, args_enc, kwargs_enc, backward,
                                                     item_seed(1234, name.full_name), False, options, specs))
        marks.append(time.thread_time())
        generated += sum(t.numel() for t in [*args, *kwargs.values(), *cotangents] if isinstance(t, torch.Tensor))
        sides: list[Any] = []
        share: dict[str, Any] = {}
        if sharing is not None:  # as check/rerun.py shares them
            share["shared"] = Shared(sharing.written_inputs(name.api_type, name.api_name, None, args, kwargs, specs))
        want_grad = backward is not None
        plan = plan_precision(name.api_name, args, kwargs, first_output_dtype(forward.get("output")), specs,
                              PrecisionPolicy("auto", "strict"))

        def bench_dtype(t: torch.Tensor, plan: Plan = plan) -> torch.dtype:
            raise_to = plan.raise_to
            if raise_to is None or t.dtype not in RAISABLE or (plan.hf32 and t.dtype == torch.float32):
                return t.dtype
            return raise_to

        for bench, dtype_for, move in ((False, lambda t: t.dtype, None if share else device.to_device),
                                       (True, bench_dtype, None)):
            sides.append(make_side(args, kwargs, target=Target("cpu", dtype_for, bench, move, shared=share.get("shared")),
                                   requires_grad=ctx.requires_grad, want_grad=want_grad))
            marks.append(time.thread_time())
        try:
            resolved = resolve(name.api_type, name.api_name, device, specs, forward)
        except Exception:
            resolved = None
        if resolved is not None:  # the third run's side: torch's run in the recorded dtype, or the magnitude run
            sides.append(third_run(options, resolved, name, specs, plan,
                                   RunInputs(args, kwargs, ctx.requires_grad, want_grad, share.get("shared"))))
        marks.append(time.thread_time())
        for phase, start, stop in zip(spent, marks, marks[1:]):
            spent[phase] += stop - start
        del ctx, args, kwargs, cotangents, sides
    table = {phase: seconds / generated * 1e9 for phase, seconds in spent.items()}
    table["all"] = sum(table.values())
    return {"dump": table}


def _cpu() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").is_file() else "unknown CPU"
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return f"{model}, avx512_bf16: {'yes' if 'avx512_bf16' in flags else 'no'}"


def _print(columns: dict[str, dict[str, dict[str, float]]]) -> None:
    print(f"ns per generated element, least thread CPU; {_cpu()}")
    names = list(columns)
    if "dump" in columns[names[0]]:
        print("| phase | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
        for phase in columns[names[0]]["dump"]:
            print(f"| {phase} | " + " | ".join(f"{columns[n]['dump'][phase]:.2f}" for n in names) + " |")
        return
    print("| dtype | elements | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for dtype in DTYPES:
        for numel in SIZES:
            cells = " | ".join(f"{columns[n][dtype][str(numel)]:.2f}" for n in names)
            print(f"| {dtype.split('.')[1]} | {numel:,} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trees", nargs="+", type=Path, help="source trees to compare, interleaved")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dump", help="a dump.json: every item's inputs and side copies instead")
    args = parser.parse_args()
    if args.trees:
        runs: dict[str, list[dict[str, dict[str, float]]]] = {str(t): [] for t in args.trees}
        for _ in range(args.rounds):
            for tree in args.trees:
                # one child per tree: this file run as a script (its own folder first on the path, not the
                # repository), with the tree's pytest_msprobe found first through PYTHONPATH
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree.resolve()),
                                                                                 os.environ.get("PYTHONPATH")]))}
                out = subprocess.run([sys.executable, __file__, "--json", "--repeat", str(args.repeat),
                                      *(["--dump", args.dump] if args.dump else [])],
                                     check=True, capture_output=True, text=True, env=env).stdout
                runs[str(tree)].append(json.loads(out))
        columns = {name: {d: {s: min(r[d][s] for r in rounds) for s in rounds[0][d]} for d in rounds[0]}
                   for name, rounds in runs.items()}
        print(json.dumps(columns) if args.json else "", end="")
        if not args.json:
            _print(columns)
        return
    table = measure_dump(args.dump) if args.dump else measure(args.repeat)
    if args.json:
        print(json.dumps(table))
    else:
        _print({"this tree": table})


if __name__ == "__main__":
    main()
