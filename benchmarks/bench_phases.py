"""Where a run's time goes, per element: each phase's cost per generated input element and per compared
output element, on one dump, at -n 0 and -n 2.

    python -m benchmarks bench_phases [DUMP_JSON] [--workers 0 2] [--repeat 3] [--standard strict]
           [--detail] [--pytest-arg=--override-ini=msprobe_threads=2 ...]

Each setting runs pytest-msprobe on the dump (`--msprobe-device cpu`), the settings interleaved round by
round so that a shared machine's load drift hits each alike; the fastest round of each is shown. For
it: wall time, CPU time and peak RSS (of the largest process, controller or worker), collection, and the
sums over items of the phases in `record["timings"]`: inputs per generated input element (the elements of
each item's recorded input tensors), the device, bench and reference runs, and the checks (`compare`) per
compared output element (the elements of every compared output). "own work" is everything but the API
runs (device, bench, reference) on the items' thread: with a spare core the bench runs beside it, in the
helper thread (records whose timings have `bench_wait_s`), and its time is left out there, as is the
making of its side there (`inputs_beside_s`, counted in the inputs); at -n 2 the phase sums hold
both workers' time, so shares are of 2 x wall. Also: the speed-up of -n 2 over -n 0, and what a worker
loses (the phase sums against 2 x wall: start-up, idle time at the end, pytest and xdist).

With evals/probes/run_probe.py in every process, each run's wall and CPU time is broken down step by
step (interpreter and pytest start-up, plugin load, collection, the first item's torch and numba
imports, the items' phases and their per-item overhead, the files written at sessionfinish, teardown),
per process, and -n 2's loss against a perfect 2x of -n 0 is laid out: the CPU bound (-n 0 already
keeps a helper thread busy), the controller's CPU and its reports, each worker's start-up and
collection, the items' extra CPU, idle workers at the end. The round of least CPU time is shown.
`--detail` adds, per process, the items' thread's time step by step (run_probe.py's "steps": pytest's
hooks, the package's calls outside the timed phases, the cyclic collector), per item and in all.

Every figure names the CPU model and whether it has native bf16 (the API runs of a bf16 dump are fast
only with it, so the checker's own work shows). Measure on a quiet machine: on a shared one the CPU time
and the per-element costs are the figures to trust. The header says whether Python caches bytecode: with
PYTHONDONTWRITEBYTECODE set (some containers set it) every process compiles the package again, and pytest
rewrites its modules' asserts, about 0.7 s per process on an AMD EPYC (avx512_bf16: yes).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_vs_msprobe import API_PHASES, DUMPS, load, ours
from benchmarks.machine import cpu_model
from evals.probes.phases import on_thread
from evals.probes.processes import load_processes, mark_span, print_breakdown, print_steps
from evals.probes.run_probe import DETAIL_ENV

ROOT = Path(__file__).resolve().parents[1]


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


def loss_analysis(one: dict[str, Any], two: dict[str, Any]) -> None:
    """Where -n 2 loses against a perfect 2x of -n 0, from both runs' per-process marks."""
    w0, w2 = one["wall"], two["wall"]
    cpu0, cpu2 = one["cpu"], two["cpu"]
    main0 = one["processes"]["main"]
    workers = {n: p for n, p in two["processes"].items() if n != "main"}
    ctrl = two["processes"].get("main")
    print(f"\n-n 2 against -n 0: {w0 / w2:.2f}x (target 1.8x); CPU -n 0 {cpu0:.1f} s in {w0:.1f} s wall = "
          f"{cpu0 / w0:.2f} cores busy, -n 2 {cpu2:.1f} s in {w2:.1f} s = {cpu2 / w2:.2f} cores")
    print(f"  bound from CPU alone: 2 cores x {w0:.1f} s / {cpu2:.1f} s CPU of -n 2 = {2 * w0 / cpu2:.2f}x; with no "
          f"extra CPU at all, 2 / {cpu0 / w0:.2f} cores already used by -n 0 = {2 * w0 / cpu0:.2f}x")
    if ctrl is not None:
        c = ctrl["counts"]
        print(f"  controller: {ctrl['marks']['unconfigure_done'][1]:.2f} s CPU ({mark_span(ctrl, 'start', 'configured')[1]:.2f} "
              f"start-up and configure, {mark_span(ctrl, 'collected', 'sessionfinish_start')[1]:.2f} while workers ran: "
              f"{c['reports']:.0f} reports, {c['report_bytes'] / max(c['reports'], 1):.0f} bytes each, "
              f"{mark_span(ctrl, 'sessionfinish_start', 'sessionfinish_done')[1]:.2f} writing the files)")
    start0 = mark_span(main0, "start", "numba_imported")[1]
    for n, p in sorted(workers.items()):
        ready = mark_span(p, "start", "numba_imported")
        print(f"  {n}: start-up to its first item's work {ready[1]:.2f} s CPU ({ready[0]:.2f} s wall; -n 0's process "
              f"{start0:.2f} s CPU), collection again {mark_span(p, 'configured', 'collected')[1]:.2f} s CPU, items "
              f"{p['counts']['items']:.0f} in {p['counts']['items_cpu']:.2f} s CPU, idle at the end "
              f"{max(q['marks']['last_item_done'][0] for q in workers.values()) - p['marks']['last_item_done'][0]:.2f} s")
    items0 = main0["counts"]["items_cpu"]
    items2 = sum(p["counts"]["items_cpu"] for p in workers.values())
    print(f"  items' CPU: -n 0 {items0:.2f} s (its helper thread included), -n 2 {items2:.2f} s (+{items2 - items0:.2f}: "
          f"two processes share caches and memory bandwidth, each faults its own heap in and loads numba's cache)")
    extra = cpu2 - cpu0
    print(f"  -n 2 spends {extra:.1f} s more CPU than -n 0: a second process's start-up, the controller, and the items' "
          "extra above")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", nargs="?", type=Path, default=next((d for d in DUMPS if d.is_file()), None))
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--standard", default="strict")
    parser.add_argument("--pytest-arg", dest="pytest_args", action="append", default=[])
    parser.add_argument("--detail", action="store_true", help="time each item's steps outside its phases (the "
                        "probe wraps the package's functions: a little slower)")
    args = parser.parse_args()
    if args.detail:
        os.environ[DETAIL_ENV] = "1"
    if args.dump is None or not args.dump.is_file():
        raise SystemExit("no dump: pass a dump.json")
    cpu = cpu_model()
    cached = "off (PYTHONDONTWRITEBYTECODE is set)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
    print(f"dump {args.dump}; CPU: {cpu}; bytecode cache: {cached}")
    best: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for round_ in range(args.repeat):
            for workers in args.workers:
                print(f"  load {load()}: -n {workers}", flush=True)
                folder = work / f"processes-{workers}-{round_}"
                folder.mkdir()
                run = ours(args.dump, args.standard, workers, work, args.pytest_args, processes=folder)
                run["end"] = time.time()
                run["processes"] = load_processes(folder)
                out = max(work.glob(f"out-{args.standard}-{workers}-*"), key=lambda p: p.stat().st_mtime)
                run["generated"], run["compared"] = element_counts(args.dump, out)
                if workers not in best or run["cpu"] < best[workers]["cpu"]:
                    best[workers] = run
    print(f"\nthe round of least CPU time of each setting (of {args.repeat}); CPU: {cpu}")
    for workers, run in sorted(best.items()):
        p, procs = run["phases"], max(1, workers)
        api = p["device"] + p["bench"] + p["reference"]
        own = procs * run["wall"] - on_thread(p, API_PHASES)
        print(f"\n-n {workers}: wall {run['wall']:.1f} s, CPU {run['cpu']:.1f} s, peak RSS {run['rss']:.0f} MiB, "
              f"{run['items']} items, collection {run['collection']:.2f} s")
        print(f"  API runs {api:.1f} s (device {p['device']:.1f}, bench {p['bench']:.1f}, reference "
              f"{p['reference']:.1f}; {p.get('bench_beside', 0.0):.1f} of the bench beside the items' thread); own "
              f"work {own:.1f} s = {own / (procs * run['wall']):.0%} of "
              f"{procs} x wall; wall / API runs {procs * run['wall'] / max(api, 1e-9):.2f}")
        print(f"  inputs {p['inputs']:.2f} s = {p['inputs'] / max(run['generated'], 1) * 1e9:.2f} ns per generated "
              f"element ({run['generated']:,}; {p.get('inputs_beside', 0.0):.2f} s of it beside the items' thread: "
              f"the bench's side); checks {p['compare']:.2f} s = "
              f"{p['compare'] / max(run['compared'], 1) * 1e9:.2f} ns per compared element ({run['compared']:,})")
        rest = procs * run["wall"] - on_thread(p)
        print(f"  outside the phases (start-up, pytest, xdist, idle workers, reports): {rest:.1f} s")
        print_breakdown(run)
        print_steps(run)
    if 0 in best and 2 in best:
        loss_analysis(best[0], best[2])


if __name__ == "__main__":
    main()
