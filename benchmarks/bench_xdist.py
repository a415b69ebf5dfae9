"""xdist speed-up and per-item plugin overhead on a synthetic dump of 1,000+ small API calls.

    python -m benchmarks bench_xdist [--items 1008] [--repeat 3] [--shared] [--skewed]

* speed-up: wall time of `pytest DUMP -n 0` vs `-n 2` (whole command, startup included) and the
  steady-state throughput (items per second between the first and the last finished item, seen
  on the controller), from the median of --repeat runs; plus where the wall time goes.
* overhead: in the -n 0 run, the time between consecutive items finishing minus the item's own
  `record["timings"]` (device and bench runs, backward, compare). Reported with input building
  (`inputs_s`) counted as overhead and not, as median and mean in ms. Everything else counts: pytest's runtest
  protocol, our hooks, the report, the terminal line, the journal write.
* --shared: the same comparison on the shared msprobe dumps (PyTorch ones).
* --skewed: 1,000 small calls plus one large matmul at the end of the dump, -n 2 with the plugin's
  cost scheduler (the default) and with xdist's own `load` scheduler in dump order
  (`-o msprobe_schedule=xdist -p no:msprobe-cost-order`).

The probe is this module loaded as a pytest plugin (`-p benchmarks.bench_xdist`); it writes its
timestamps to $BENCH_PROBE_OUT.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- the probe plugin

_imported = time.perf_counter()  # the probe loads with pytest's plugins, at startup
_finished: list[float] = []
_timings: list[dict[str, float]] = []


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call":
        _timings.append(dict((getattr(report, "msprobe", None) or {}).get("timings") or {}))


def pytest_runtest_logfinish(nodeid: str) -> None:
    _finished.append(time.perf_counter())


def pytest_sessionfinish(session: Any) -> None:
    out = os.environ.get("BENCH_PROBE_OUT")
    if out and not hasattr(session.config, "workerinput"):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        Path(out).write_text(json.dumps({"finished": _finished, "timings": _timings, "imported": _imported,
                                         "ended": time.perf_counter(),
                                         "controller_cpu_s": usage.ru_utime + usage.ru_stime}))


# --------------------------------------------------------------------------- the benchmark


def run(args: list[str], probe: Path) -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "BENCH_PROBE_OUT": str(probe), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.bench_xdist",
           "-p", "no:hypothesispytest", "-p", "no:benchmark", "--msprobe-device", "cpu",
           "--msprobe-standard", "original", *args]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=probe.parent, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1) or not probe.exists():
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall, json.loads(probe.read_text())


def throughput(probe: dict[str, Any]) -> float:
    finished: list[float] = probe["finished"]
    return (len(finished) - 1) / (finished[-1] - finished[0])


def check_s(timings: dict[str, float], with_inputs: bool) -> float:
    """The API runs and the comparison. check.py's compare_s already spans the backward passes."""
    return sum(v for k, v in timings.items()
               if not k.endswith("_backward_s") and (k != "inputs_s" or not with_inputs))


def overhead_ms(probe: dict[str, Any], with_inputs: bool) -> list[float]:
    finished, timings = probe["finished"], probe["timings"]
    return [1e3 * (finished[i] - finished[i - 1] - check_s(timings[i], with_inputs)) for i in range(1, len(finished))]


def best(paths: list[str], workers: str, repeat: int, work: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The median run by wall time (this machine is shared; the median resists a noisy neighbour)."""
    return median([run([*paths, "-n", workers, *extra], work / "probe.json") for _ in range(repeat)])


def median(results: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    wall, probe = sorted(results, key=lambda r: r[0])[len(results) // 2]
    return {"wall": wall, "throughput": throughput(probe), "probe": probe, "items": len(probe["finished"])}


def timeline(probe: dict[str, Any]) -> str:
    """pytest start -> first result (startup: workers, collection, torch import) -> last result -> exit."""
    start, first, last = probe["imported"], probe["finished"][0], probe["finished"][-1]
    return f"startup {first - start:5.2f} s, items {last - first:5.2f} s, files {probe['ended'] - last:4.2f} s"


def compare(title: str, paths: list[str], repeat: int, work: Path) -> dict[str, Any]:
    """-n 0, -n 2 as a user gets it (the plugin may keep a small run in one process,
    msprobe_min_work_per_worker), and -n 2 with both workers started whatever the work; the median
    of --repeat rounds of the three."""
    settings = {"serial": ("-n", "0"), "parallel": ("-n", "2"),
                "forced": ("-n", "2", "-o", "msprobe_min_work_per_worker=0")}
    runs: dict[str, list[tuple[float, dict[str, Any]]]] = {k: [] for k in settings}
    for _ in range(repeat):  # interleaved, so that a change in the machine's load hits every setting alike
        for key, args in settings.items():
            runs[key].append(run([*paths, *args], work / "probe.json"))
    serial, parallel, forced = (median(runs[k]) for k in settings)
    print(f"{title}: {serial['items']} items")
    print(f"  wall      -n 0 {serial['wall']:6.2f} s   -n 2 {parallel['wall']:6.2f} s ({serial['wall'] / parallel['wall']:.2f}x)"
          f"   -n 2, workers forced {forced['wall']:6.2f} s ({serial['wall'] / forced['wall']:.2f}x)")
    print(f"  steady    -n 0 {serial['throughput']:6.1f}/s  -n 2, workers forced {forced['throughput']:6.1f}/s  "
          f"speed-up {forced['throughput'] / serial['throughput']:.2f}x")
    print(f"  -n 0: {timeline(serial['probe'])}; controller CPU {serial['probe']['controller_cpu_s']:.2f} s")
    print(f"  -n 2, forced: {timeline(forced['probe'])}; controller CPU {forced['probe']['controller_cpu_s']:.2f} s")
    return serial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1008)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shared", action="store_true", help="also the shared PyTorch dumps")
    parser.add_argument("--skewed", action="store_true", help="also the expensive-first ordering comparison")
    args = parser.parse_args()
    from benchmarks.synthetic import write_skewed_dump, write_synthetic_dump

    print(f"cpus {os.cpu_count()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dump = write_synthetic_dump(work / "synthetic", args.items)
        serial = compare("synthetic dump", [str(dump)], args.repeat, work)
        for with_inputs in (False, True):
            values = overhead_ms(serial["probe"], with_inputs)
            label = "incl. input building" if with_inputs else "excl. input building"
            print(f"  overhead per item ({label}): median {statistics.median(values):.3f} ms, "
                  f"mean {statistics.fmean(values):.3f} ms")
        if args.shared:
            shared = sorted(str(p) for p in (ROOT.parent / "shared" / "dumps").glob("*_pt_*/dump.json"))
            compare(f"shared dumps ({len(shared)})", shared, args.repeat, work)
        if args.skewed:
            skewed = str(write_skewed_dump(work / "skewed"))
            forced = ("-o", "msprobe_min_work_per_worker=0")
            ordered = best([skewed], "2", args.repeat, work, forced)
            plain = best([skewed], "2", args.repeat, work,
                         (*forced, "-o", "msprobe_schedule=xdist", "-p", "no:msprobe-cost-order"))
            print(f"skewed dump: {ordered['items']} items, -n 2: cost scheduler {ordered['wall']:.2f} s, "
                  f"xdist load in dump order {plain['wall']:.2f} s")


if __name__ == "__main__":
    main()
