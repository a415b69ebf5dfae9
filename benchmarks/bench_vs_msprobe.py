"""pytest-msprobe against msprobe 26.2's own checker, side by side on one dump and one CPU.

    python -m benchmarks bench_vs_msprobe [DUMP_JSON] [--standards strict msprobe] [--workers 0 2]
           [--msprobe-python PYTHON_OF_AN_MSPROBE_VENV] [--no-msprobe] [--repeat 1]
           [--pytest-arg=--override-ini=msprobe_threads=2 ...]

For each pytest-msprobe run (one per standard and -n): wall time of the whole command, CPU time and
peak RSS of its processes (os.wait4: the largest process, controller or worker), and where the wall time
went: collection (start-up to the last collected item, read by a probe plugin), then the sums over
items of each phase in `record["timings"]` (inputs, device, bench, reference, compare) and the rest
(pytest, hooks, reports, xdist, writing the files). "outside API runs" is the share of the wall time
that is not a device, bench or reference run; with -n 2 the phase sums add up two workers' time, so
the shares are of 2 x wall. Then msprobe's `acc_check` on the same dump with the device on CPU
(../shared/tools/msprobe_cpu.py, msprobe installed in its own venv: `pip install mindstudio-probe==26.2.0
torch==2.13.0`), and the speed-up.

msprobe checks a forward call and its backward in one step; pytest-msprobe makes them two items (the
backward item runs the forward again). Both use the device (CPU) in the dumped dtype and the bench in
raised precision. pytest-msprobe runs torch on 1 thread per process (msprobe_threads), msprobe on
torch's default. The machine may be shared: the load average is printed before every run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from evals.probes.phases import PHASES, add_phases, on_thread

ROOT = Path(__file__).resolve().parents[1]
DUMPS = (ROOT.parent / "shared" / "dumps" / "msprobe26_pt_statistics_llama_bf16" / "dump.json",)  # with none given
MSPROBE_CPU = ROOT.parent / "shared" / "tools" / "msprobe_cpu.py"
API_PHASES = ("device", "bench", "reference")

# --------------------------------------------------------------------------- the probe plugin

_marks: dict[str, float] = {"start": time.time()}


def pytest_collection_finish(session: Any) -> None:
    _marks["collected"] = time.time()


def pytest_unconfigure(config: Any) -> None:
    out = os.environ.get("BENCH_VS_MSPROBE_OUT")
    if out and not hasattr(config, "workerinput"):
        Path(out).write_text(json.dumps(_marks))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Any) -> None:
    """Under xdist the controller does not collect: the last worker's collection is what the first item
    waits for."""
    _marks["collected"] = time.time()


# --------------------------------------------------------------------------- the benchmark


def wait(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MiB, exit code) of a command and every process it waited for."""
    start = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    return (time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            os.waitstatus_to_exitcode(status))


def phases(out: Path) -> tuple[int, dict[str, float]]:
    (path,) = out.glob("msprobe_records_*.jsonl")
    sums = dict.fromkeys(PHASES, 0.0)
    count = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        count += 1
        add_phases(sums, json.loads(line).get("timings") or {})
    return count, sums


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def ours(dump: Path, standard: str, workers: int, work: Path, extra: list[str],
         processes: Path | None = None) -> dict[str, Any]:
    """One pytest-msprobe run; with `processes`, a directory, evals/probes/run_probe.py writes each
    process's marks there."""
    out = work / f"out-{standard}-{workers}-{time.monotonic_ns()}"
    probe = work / "probe.json"
    env = {**os.environ, "BENCH_VS_MSPROBE_OUT": str(probe), "PYTHONPATH": str(ROOT)}
    if processes is not None:
        env["MSPROBE_RUN_PROBE_DIR"] = str(processes)
        extra = ["-p", "evals.probes.run_probe", *extra]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
           "-p", "benchmarks.bench_vs_msprobe", str(dump.resolve()), "--msprobe-device", "cpu", "--msprobe-standard", standard,
           "--msprobe-out", str(out), "-n", str(workers), *extra]
    wall, cpu, rss, code = wait(cmd, work, env)  # runs in `work`: the dump's path is absolute above
    if code not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited with {code}")
    marks = json.loads(probe.read_text())
    items, sums = phases(out)
    return {"tool": f"pytest-msprobe {standard} -n {workers}", "wall": wall, "cpu": cpu, "rss": rss, "items": items,
            "collection": marks.get("collected", marks["start"]) - marks["start"], "phases": sums, "workers": workers}


def msprobe(dump: Path, python: str, work: Path) -> dict[str, Any]:
    out = work / f"msprobe-{time.monotonic_ns()}"
    out.mkdir()
    wall, cpu, rss, code = wait([python, str(MSPROBE_CPU), "acc_check", "-api_info", str(dump.resolve()), "-o", str(out)],
                                work, dict(os.environ))
    results = list(out.glob("accuracy_checking_result_*.csv"))
    rows = len(results[0].read_text(encoding="utf-8-sig").splitlines()) - 1 if results else 0
    if code != 0 or not results:
        raise SystemExit(f"msprobe acc_check exited with {code} and wrote {rows} rows")
    return {"tool": "msprobe 26.2 acc_check", "wall": wall, "cpu": cpu, "rss": rss, "items": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", nargs="?", type=Path, default=next((d for d in DUMPS if d.is_file()), None))
    parser.add_argument("--standards", nargs="+", default=["strict", "msprobe"])
    parser.add_argument("--workers", type=int, nargs="+", default=[0])
    parser.add_argument("--msprobe-python", default=os.environ.get("MSPROBE_PYTHON"),
                        help="the python of a venv with mindstudio-probe (default: $MSPROBE_PYTHON)")
    parser.add_argument("--no-msprobe", action="store_true", help="only pytest-msprobe")
    parser.add_argument("--repeat", type=int, default=1, help="pytest-msprobe runs per setting; the fastest is shown")
    parser.add_argument("--pytest-arg", dest="pytest_args", action="append", default=[],
                        help="one more pytest argument (repeat it), e.g. --pytest-arg=--override-ini=msprobe_threads=2")
    args = parser.parse_args()
    if args.dump is None or not args.dump.is_file():
        raise SystemExit("no dump: give a dump.json")
    if not args.no_msprobe and not args.msprobe_python:
        raise SystemExit("no msprobe: give --msprobe-python VENV/bin/python (or set MSPROBE_PYTHON), or --no-msprobe")
    print(f"dump {args.dump} ({args.dump.stat().st_size / 1e6:.1f} MB); cpus {os.cpu_count()}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for standard in args.standards:
            for workers in args.workers:
                runs = []
                for _ in range(args.repeat):
                    print(f"  load {load()}: pytest-msprobe --msprobe-standard {standard} -n {workers}", flush=True)
                    runs.append(ours(args.dump, standard, workers, work, args.pytest_args))
                rows.append(min(runs, key=lambda r: r["wall"]))
        if not args.no_msprobe:
            print(f"  load {load()}: msprobe acc_check", flush=True)
            rows.append(msprobe(args.dump, args.msprobe_python, work))
    print(f"  load {load()} at the end\n")
    reference = rows[-1] if not args.no_msprobe else None
    print(f"{'run':34} {'items':>5} {'wall s':>7} {'CPU s':>7} {'peak RSS MiB':>12} {'vs msprobe':>10}")
    for row in rows:
        speed = f"{reference['wall'] / row['wall']:.2f}x" if reference else "-"
        print(f"{row['tool']:34} {row['items']:>5} {row['wall']:>7.1f} {row['cpu']:>7.1f} {row['rss']:>12.0f} {speed:>10}")
    print(f"\n{'run':34} {'collect':>7} {'inputs':>7} {'device':>7} {'bench':>7} {'ref':>6} {'compare':>7} "
          f"{'other':>6} {'outside API':>11}")
    for row in rows:
        if "phases" not in row:
            continue
        p, width = row["phases"], row["wall"] * max(row["workers"], 1)
        other = width - row["collection"] * max(row["workers"], 1) - on_thread(p)
        outside = 1 - on_thread(p, API_PHASES) / width
        print(f"{row['tool']:34} {row['collection']:>7.1f} {p['inputs']:>7.1f} {p['device']:>7.1f} {p['bench']:>7.1f} "
              f"{p['reference']:>6.1f} {p['compare']:>7.1f} {other:>6.1f} {outside:>10.0%}")


if __name__ == "__main__":
    main()
