"""A 7B-class call's check, per phase: wall, CPU and peak RSS, whole or in pieces, at -n 0 and -n 2, with the bench
on the CPU and, where torch sees CUDA, on it (-o msprobe_bench_device=cuda).

    python -m benchmarks bench_scale DUMP_JSON [--only Functional.linear.14.forward] [--workers 0 2]
           [--max-memory 512MiB] [--bench-devices cpu cuda] [--same-as SMALL_DUMP_JSON]

Each setting runs pytest-msprobe on the dump's chosen items (`--msprobe-device cpu`) with this module as a pytest
plugin in every process: it wraps each phase of an item (the inputs, the device run, the bench, the third and
magnitude runs, the comparison, and, for an item checked in pieces, the pieces' runs and checks together) and takes
its wall and CPU time (the process's, both threads) and its peak RSS (Linux's VmHWM, reset at the phase's start
through /proc/self/clear_refs). Printed per setting: the run's wall, CPU and peak RSS (of the largest process), each
phase's, the items' statuses (a skip with its reason), and the items of highest peak against their "own tensors"
(the call's inputs and device output and, for a backward item, its gradients in and out): the ratio the memory
budget holds.

`--same-as SMALL_DUMP_JSON` checks the chosen items of a smaller dump twice, whole and forced into pieces
(`--max-memory`), and prints whether every record is the same (rows, statistics, verdicts; not the timings).

Figures, with their date, machine and command: benchmarks/README.md ("bench_scale.py").
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT_ENV = "BENCH_SCALE_OUT"  # the probe's folder: one JSON file per process
PHASES = ("inputs", "device", "bench", "reference", "magnitude", "compare", "pieces")

# --------------------------------------------------------------------------- the probe plugin (in every process)

_phases: dict[str, dict[str, float]] = {}


def _hwm_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # the peak resident set size back to the current one
    except OSError:
        pass


def _hwm() -> float:
    """This process's peak resident set size since the last reset, in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _measured(phase: Callable[[Any], str], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its wall, CPU and peak RSS added to the phase `phase(args)` names."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        name = phase(args)
        _note_peak()
        _hwm_reset()
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            sums = _phases.setdefault(name, {"wall": 0.0, "cpu": 0.0, "rss": 0.0, "calls": 0})
            sums["wall"] += time.perf_counter() - wall
            sums["cpu"] += time.process_time() - cpu
            sums["rss"] = max(sums["rss"], _hwm())
            sums["calls"] += 1
            _note_peak()
    return wrapper


_items: dict[str, float] = {}  # nodeid -> the item's peak RSS (MiB), its phases' peaks included
_item_peak = [0.0]


def _note_peak() -> None:
    """The peak since the last reset, kept for the running item before a phase resets it."""
    _item_peak[0] = max(_item_peak[0], _hwm())


def _timed_phase(args: Any) -> str:
    """calls.timed's key ("bench_s", "reference_backward_s") as a phase."""
    key = str(args[1]).removesuffix("_s").removesuffix("_backward")
    return key if key in PHASES else "other"


def pytest_configure(config: Any) -> None:
    if not os.environ.get(OUT_ENV) or getattr(pytest_configure, "done", False):
        return
    pytest_configure.done = True  # type: ignore[attr-defined]
    from pytest_msprobe.check import calls, piece_check, rerun

    calls.timed = _measured(_timed_phase, calls.timed)
    rerun.compare_outputs = _measured(lambda a: "compare", rerun.compare_outputs)  # type: ignore[attr-defined]
    rerun.prepared_inputs = _measured(lambda a: "inputs", rerun.prepared_inputs)  # type: ignore[attr-defined]
    piece_check.check = _measured(lambda a: "pieces", piece_check.check)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    """Each item's peak RSS, from its call's start (the inputs it builds included)."""
    _hwm_reset()
    _item_peak[0] = 0.0
    try:
        return (yield)
    finally:
        _note_peak()
        _items[item.nodeid.rsplit("::", 1)[-1]] = _item_peak[0]


def pytest_unconfigure(config: Any) -> None:
    out = os.environ.get(OUT_ENV)
    if out and _phases:
        Path(out, f"{os.getpid()}.json").write_text(json.dumps({"phases": _phases, "peak": _peak(),
                                                                "items": _items}))


def _peak() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- the driver


def _own_bytes(dump: Path, only: list[str]) -> dict[str, int]:
    """Per chosen item (every item without `only`), the bytes of its call's own tensors: a forward item's inputs
    and output, a backward item's those and its gradients in and out (from the recorded shapes and dtypes, as the
    default budget counts them)."""
    from pytest_msprobe.dump.index import tensor_bytes

    data = json.loads(dump.read_text())["data"]
    forward = {k.rsplit(".", 1)[0]: tensor_bytes(v) for k, v in data.items() if k.endswith(".forward")}
    return {k: forward.get(k.rsplit(".", 1)[0], 0) + (tensor_bytes(v) if k.endswith(".backward") else 0)
            for k, v in data.items() if not only or k in only}


def run(dump: Path, only: list[str], workers: int, extra: list[str], work: Path) -> dict[str, Any]:
    """One pytest-msprobe run of the chosen items: wall, CPU, peak RSS, the probe's phases and the records."""
    from benchmarks.bench_vs_msprobe import wait

    out, probe = work / f"out-{time.monotonic_ns()}", work / f"probe-{time.monotonic_ns()}"
    probe.mkdir()
    env = {**os.environ, OUT_ENV: str(probe), "PYTHONPATH": str(ROOT)}
    targets = [f"{dump.resolve()}::{name}" for name in only] or [str(dump.resolve())]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.bench_scale", *targets,
           "--msprobe-device", "cpu", "--msprobe-out", str(out), "-n", str(workers),
           "-o", "msprobe_min_work_per_worker=0", *extra]
    wall, cpu, rss, code = wait(cmd, work, env)
    if code not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited with {code}")
    phases: dict[str, dict[str, float]] = {}
    items: dict[str, float] = {}
    for path in probe.glob("*.json"):
        measured = json.loads(path.read_text())
        items.update(measured.get("items", {}))
        for name, sums in measured["phases"].items():
            into = phases.setdefault(name, {"wall": 0.0, "cpu": 0.0, "rss": 0.0, "calls": 0})
            for key in ("wall", "cpu", "calls"):
                into[key] += sums[key]
            into["rss"] = max(into["rss"], sums["rss"])
    (records,) = out.glob("msprobe_records_*.jsonl")
    recs = {f"{r['api']}.{r['direction']}": r for r in map(json.loads, records.read_text().splitlines())}
    # resetting VmHWM (each phase does) resets what the kernel reports as the process's peak too: the run's peak is
    # the largest peak the probe saw
    rss = max([rss, *items.values(), *(p["rss"] for p in phases.values())])
    return {"wall": wall, "cpu": cpu, "rss": rss, "phases": phases, "records": recs, "items": items}


def show(title: str, result: dict[str, Any], own: dict[str, int]) -> None:
    largest = max(own.values(), default=0)
    print(f"\n{title}: wall {result['wall']:.1f} s, CPU {result['cpu']:.1f} s, peak RSS {result['rss'] / 1024:.2f} GiB"
          + (f" = {result['rss'] * 2**20 / largest:.2f}x the largest call's own tensors ({largest / 2**30:.2f} GiB)"
             if largest else ""))
    for name in (*PHASES, "other"):
        p = result["phases"].get(name)
        if p:
            print(f"  {name:10s} wall {p['wall']:8.1f} s  CPU {p['cpu']:8.1f} s  peak RSS {p['rss'] / 1024:6.2f} GiB"
                  f"  ({int(p['calls'])} calls)")
    statuses = collections.Counter(r["status"] for r in result["records"].values())
    print("  items: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    for key, record in result["records"].items():  # a skip says why: not cut and over what the host has free
        if record["status"] not in ("pass", "warning"):
            print(f"    {key}: {record['status']}: {record.get('message', '')[:240]}")
    worst = sorted(result["records"].items(), key=lambda kv: -result["items"].get(kv[0], 0.0))
    for key, record in worst[:12]:  # the items with the highest peaks
        mine, peak = own.get(key, 0), result["items"].get(key, 0.0)
        pieces = record.get("pieces")
        how = f"in pieces of {pieces['rows']} rows x {pieces['columns']} columns ({pieces['blocks']} blocks)" \
            if pieces else "whole"
        wall = sum(v for k, v in record.get("timings", {}).items() if k.endswith("_s"))
        print(f"  {key}: {record['status']} {how}; own tensors {mine / 2**30:.2f} GiB, item peak RSS "
              f"{peak / 1024:.2f} GiB" + (f" = {peak * 2**20 / mine:.2f}x own" if mine else "") + f"; {wall:.1f} s")
        if record.get("message"):
            print(f"    {record['message'][:300]}")


def same_records(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The items whose records differ in more than timings, the settings' hash and the pieces' own keys."""
    def kept(record: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in record.items() if k not in ("timings", "pieces", "entry_key", "notes")}
        out["notes"] = [n for n in record.get("notes", []) if not n.startswith("checked in pieces of ")]
        return out

    return [key for key in a.keys() | b.keys() if key not in a or key not in b or kept(a[key]) != kept(b[key])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", type=Path)
    parser.add_argument("--only", nargs="*", default=["Functional.linear.14.forward"],
                        help="items to check (none: every item of the dump); default: the lm_head of the 7b dump")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--max-memory", default="default",
                        help="--msprobe-max-memory of the runs (default: none given, the default budget)")
    parser.add_argument("--bench-devices", nargs="+", default=None,
                        help="default: cpu, and cuda where torch.cuda.is_available()")
    parser.add_argument("--same-as", type=Path, default=None,
                        help="a smaller dump whose chosen items are checked whole and in pieces, records compared")
    parser.add_argument("--pytest-arg", dest="pytest_args", action="append", default=[])
    args = parser.parse_args()
    from benchmarks.machine import cpu_model

    devices = args.bench_devices
    if devices is None:
        import torch

        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_model()}, {os.cpu_count()} cores; {args.dump}")
    own = _own_bytes(args.dump, args.only)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.same_as is not None:
            base = ["-o", "msprobe_helper_thread=off", *args.pytest_args]
            whole = run(args.same_as, args.only, 0, [*base, "--msprobe-max-memory", "1TiB"], work)
            forced = "384MiB" if args.max_memory == "default" else args.max_memory  # the small dump fits whole
            cut = run(args.same_as, args.only, 0, [*base, "--msprobe-max-memory", forced], work)
            small = _own_bytes(args.same_as, args.only)
            show(f"{args.same_as.parent.parent.parent.name}, whole", whole, small)
            show(f"{args.same_as.parent.parent.parent.name}, --msprobe-max-memory {forced}", cut, small)
            differ = same_records(whole["records"], cut["records"])
            print(f"records whole vs in pieces: {'the same' if not differ else 'DIFFER: ' + ', '.join(differ)}")
        for device in devices:
            for workers in args.workers:
                budget = [] if args.max_memory == "default" else ["--msprobe-max-memory", args.max_memory]
                extra = [*budget, "-o", f"msprobe_bench_device={device}", *args.pytest_args]
                show(f"-n {workers}, bench on {device}, --msprobe-max-memory {args.max_memory}",
                     run(args.dump, args.only, workers, extra, work), own)


if __name__ == "__main__":
    main()
