"""Collection time and peak memory per process for synthetic dumps of 1k, 10k and 100k entries.

    python -m benchmarks bench_collection [--sizes 1000 10000 100000] [--repeat 3]

Every xdist worker collects the whole dump, so this is what each worker pays before its first item.
Each run is a fresh `pytest --collect-only -qq` subprocess; the figures are the child's wall time,
CPU time and peak RSS (getrusage of the children), best of --repeat. A bare `pytest --version`-like
startup (collecting an empty folder) is measured too, so the dump's own share is visible.

"cold" is the first process to see the dump (it scans the JSON and writes the dump's index to the
cache folder, dumpindex.py); "cached" is every later one: the xdist workers (the controller indexes
the dump before it starts them) and reruns. Each cold run gets an empty cache folder.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def generate(folder: Path, entries: int) -> Path:
    """In a child process: this one must stay small, since forked children inherit its RSS figure."""
    subprocess.run([sys.executable, "-m", "benchmarks", "gen_dump", str(folder), "--entries", str(entries)],
                   check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return folder / "dump.json"


def run(args: list[str], cwd: Path, index_dir: Path | None = None) -> tuple[float, float, float]:
    """(wall s, cpu s, peak RSS MiB) of one pytest process, from its own rusage (os.wait4)."""
    env = dict(os.environ)
    if index_dir is not None:
        env["PYTEST_MSPROBE_INDEX_DIR"] = str(index_dir)
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                              *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, _, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "empty").mkdir()
        base = min(run(["--collect-only", "-qq", "empty"], work)[0] for _ in range(args.repeat))
        print(f"cpus {os.cpu_count()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"pytest start-up (empty folder): {base:.2f} s")
        print(f"{'entries':>8} {'dump MB':>8} {'index':>7} {'wall s':>7} {'cpu s':>6} {'peak RSS MiB':>13}")
        for size in sorted(args.sizes):
            dump = generate(work / f"d{size}", size)
            collect = ["--collect-only", "-qq", str(dump)]
            cold = [run(collect, work, work / f"cold{size}-{k}") for k in range(args.repeat)]
            cached = [run(collect, work, work / f"cold{size}-0") for _ in range(args.repeat)]
            for label, runs in (("cold", cold), ("cached", cached)):
                best = min(runs, key=lambda r: r[0])
                print(f"{size:>8} {dump.stat().st_size / 1e6:>8.1f} {label:>7} {best[0]:>7.2f} {best[1]:>6.2f} "
                      f"{best[2]:>13.0f}")


if __name__ == "__main__":
    main()
