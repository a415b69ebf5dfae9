"""The documentation's pictures, measured or rendered here (needs the docs extra: matplotlib).

    python docs/figures/make_figures.py [html] [error-model] [scaling] [--out docs/images]

html         the --msprobe-html page of the bundled approximate-softmax example, rendered by headless
             Chromium (`chromium` on PATH; Debian: apt-get install chromium) to html-report-failure.png
error-model  strict's largest and mean errors against their limits, for every float output of the bundled
             bf16 Llama-style dump: torch's kernels (clean), the correct variants and the planted bugs of
             evals/planted/arms.py (inside the device-call boundary, as evals/planted_bugs.py
             does): error-model.png
scaling      per-process collection time and peak memory against the dump's size (benchmarks/
             bench_collection.py's measurement), and the wall time of whole runs at -n 0 and -n 2 on
             synthetic dumps (benchmarks/gen_dump.py): scaling.png

Each prints the numbers it plots, with the CPU and load average, so they can be recorded in
benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _machine() -> str:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or cpu
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} CPUs, load average {load}"


# ------------------------------------------------------------------------------------------------


def html(out: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("html: no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        shutil.copytree(ROOT / "examples" / "approximate_kernel", project / "approximate_kernel")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "approximate_kernel",
                        "--msprobe-kernels", "approximate_kernel/kernels.py:KERNELS", "--msprobe-html", "report.html",
                        "--msprobe-out", "results"], cwd=project, env=env, stdout=subprocess.DEVNULL, check=False)
        page = project / "report.html"
        if not page.is_file():
            raise SystemExit("html: the run wrote no report.html")
        target = out / "html-report-failure.png"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1400,1240", f"--screenshot={target}", page.as_uri()],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"html: {target}")


# ------------------------------------------------------------------------------------------------


def _measure_error_model(dump: Path) -> list[dict[str, Any]]:
    """One point per strict-judged float output and run: the largest and mean error over their limits."""
    from evals.planted import arms as arm_table
    from evals.planted.records import api_keyword, dump_dtype, fingerprint
    from evals.planted_bugs import run
    from pytest_msprobe.verdict import strict

    captured: dict[str, tuple[float, float]] = {}
    plain = strict.strict_compare

    def recording(*args: Any, **kwargs: Any) -> Any:
        result = plain(*args, **kwargs)
        rules, stats = args[3], result.stats
        if "max_err" in stats:
            mean_limit = rules["mean_ref_factor"] * stats["ref_mean_err"] + rules["mean_slack"]
            captured[json.dumps(stats, sort_keys=True)] = (float(rules["gross"]), float(mean_limit))
        return result

    strict.strict_compare = recording  # type: ignore[assignment]
    dtype = dump_dtype(dump)
    points: list[dict[str, Any]] = []
    try:
        clean = run(dump, None, "strict", dtype, None)

        def collect(records: dict[str, dict[str, Any]], kind: str, label: str) -> None:
            for key, rec in records.items():
                base = clean.get(key)
                for k, output in enumerate(rec.get("outputs", [])):
                    stats = output.get("reference") or {}
                    limits = captured.get(json.dumps(stats, sort_keys=True))
                    if limits is None:
                        continue
                    if kind != "clean" and base is not None and k < len(base.get("outputs", [])) and \
                            fingerprint({"outputs": [output]}) == fingerprint({"outputs": [base["outputs"][k]]}):
                        continue  # the arm did not change this output: not an effective item
                    points.append({"kind": kind, "arm": label, "output": output["name"],
                                   "max": stats["max_err"] / limits[0], "mean": stats["mean_err"] / limits[1],
                                   "verdict": output.get("verdict")})

        collect(clean, "clean", "torch")
        for arm in arm_table.ARMS:
            collect(run(dump, arm, "strict", dtype, api_keyword(arm)), arm.kind, arm.name)
    finally:
        strict.strict_compare = plain  # type: ignore[assignment]
    return points


def error_model(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dump = ROOT / "examples" / "llama_tiny_bf16_statistics"
    dump = next(dump.rglob("dump.json"))
    started = time.time()
    points = _measure_error_model(dump)
    print(f"error-model: {len(points)} outputs in {time.time() - started:.0f} s on {_machine()}")
    styles = {"clean": ("torch's own kernels", "#2b6cb0", "o"), "variant": ("correct variants", "#2f855a", "s"),
              "bug": ("planted bugs", "#c53030", "x")}
    fig, ax = plt.subplots(figsize=(8, 6), dpi=120)
    for kind, (label, color, marker) in styles.items():
        mine = [p for p in points if p["kind"] == kind]
        failed = sum(p["verdict"] == "error" for p in mine)
        print(f"  {kind}: {len(mine)} outputs, {failed} failed")
        ax.scatter([max(p["max"], 1e-3) for p in mine], [max(p["mean"], 1e-3) for p in mine], s=18, c=color,
                   marker=marker, alpha=0.7, label=f"{label}: {failed} of {len(mine)} outputs fail")
    ax.axvline(1, color="k", ls="--", lw=1)
    ax.axhline(1, color="k", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("largest element error / gross-error limit")
    ax.set_ylabel("mean error / mean-error limit")
    ax.set_title(f"strict on {dump.relative_to(ROOT).parent.parent.parent} (values below 1e-3 drawn at 1e-3)",
                 fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "error-model.png")
    print(f"error-model: {out / 'error-model.png'}")


# ------------------------------------------------------------------------------------------------


def _wall(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=cwd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start


def scaling(out: Path, repeat: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.bench_collection import generate, run

    print(f"scaling: {_machine()}")
    collect_sizes = [1000, 3000, 10000, 30000, 100000]
    run_sizes = [500, 1500, 5000]
    coll: dict[str, list[tuple[float, float]]] = {"cold": [], "cached": []}
    runs: dict[int, list[float]] = {0: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for size in collect_sizes:  # best of `repeat`, as bench_collection.py takes them
            dump = generate(work / f"d{size}", size)
            args = ["--collect-only", "-qq", str(dump)]
            cold = min((run(args, work, work / f"idx{size}-{k}") for k in range(repeat)), key=lambda r: r[0])
            cached = min((run(args, work, work / f"idx{size}-0") for _ in range(repeat)), key=lambda r: r[0])
            coll["cold"].append((cold[0], cold[2]))
            coll["cached"].append((cached[0], cached[2]))
            print(f"  collect {size:>7} entries: cold {cold[0]:.2f} s {cold[2]:.0f} MiB, "
                  f"cached {cached[0]:.2f} s {cached[2]:.0f} MiB")
        for size in run_sizes:
            dump = generate(work / f"r{size}", size)
            walls: dict[int, list[float]] = {n: [] for n in runs}
            for k in range(repeat):  # interleaved, so a busy minute of the shared machine hits both
                for n in runs:
                    walls[n].append(_wall([str(dump), "-n", str(n), "--msprobe-out", str(work / f"o{size}-{n}-{k}")],
                                          work))
            for n in runs:
                runs[n].append(min(walls[n]))
                print(f"  run {size:>6} items -n {n}: best {min(walls[n]):.1f} s of "
                      f"{', '.join(f'{w:.1f}' for w in walls[n])}")
        print(f"scaling: done, {_machine()}")
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    for label, values in coll.items():
        a.plot(collect_sizes, [v[0] for v in values], marker="o", label=f"wall, {label} index")
    a.set_xscale("log")
    a.set_xlabel("entries in dump.json")
    a.set_ylabel(f"seconds per process, best of {repeat} (start-up included)")
    a.set_title("collection, per process", fontsize=10)
    mem = a.twinx()
    mem.plot(collect_sizes, [v[1] for v in coll["cold"]], color="grey", ls=":", marker="^", label="peak RSS, cold")
    mem.set_ylabel("peak RSS (MiB)")
    lines = a.get_legend_handles_labels()[0] + mem.get_legend_handles_labels()[0]
    a.legend(lines, [str(h.get_label()) for h in lines], fontsize=8, loc="upper left")
    for n, walls in runs.items():
        b.plot(run_sizes, walls, marker="o", label=f"-n {n}")
    b.set_xscale("log")
    b.set_xlabel("items (synthetic transformer-mix dump)")
    b.set_ylabel(f"wall seconds, whole run (best of {repeat})")
    b.set_title(f"whole runs on {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} at the end)", fontsize=10)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png")
    print(f"scaling: {out / 'scaling.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figures", nargs="*", default=["html", "error-model", "scaling"],
                        choices=["html", "error-model", "scaling"])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.figures:
        {"html": html, "error-model": error_model, "scaling": scaling}[name](out)


if __name__ == "__main__":
    main()
