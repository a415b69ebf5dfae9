"""Reading the run probe's files (`evals/probes/run_probe.py`): each process's marks broken down into steps
from its start to its end, and the items' thread step by step (--detail)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from evals.probes.phases import on_thread


def load_processes(folder: Path) -> dict[str, dict[str, Any]]:
    """evals/probes/run_probe.py's file of every process of one run: "main" (the controller, or the one
    process of -n 0) and the xdist workers ("gw0", ...)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def mark_span(proc: dict[str, Any], a: str, b: str) -> tuple[float, float]:
    """(wall, CPU) seconds between two marks of one process; (0, 0) when one is missing."""
    marks = proc["marks"]
    if a not in marks or b not in marks:
        return 0.0, 0.0
    return marks[b][0] - marks[a][0], marks[b][1] - marks[a][1]


def breakdown(proc: dict[str, Any], end_wall: float | None = None) -> list[tuple[str, float, float]]:
    """(step, wall s, CPU s) of one process from its start to its end: every second of it in one step."""
    marks, counts, p = proc["marks"], proc["counts"], proc["phases"]
    rows = [("interpreter and pytest start-up", *mark_span(proc, "start", "probe_imported")),
            ("plugin load and configure", *mark_span(proc, "probe_imported", "configured")),
            ("collection", *mark_span(proc, "configured", "collected"))]
    if counts["items"]:
        rows += [("wait for the first item", *mark_span(proc, "collected", "first_item")),
                 ("import torch (first item)", *mark_span(proc, "first_item", "torch_imported")),
                 ("import numba (first item)", *mark_span(proc, "torch_imported", "numba_imported"))]
        phase_sum = on_thread(p)
        for name in ("inputs", "device", "bench", "reference", "compare"):
            rows.append((f"  {'checks' if name == 'compare' else name} (phase sums)", p[name], float("nan")))
        rows.append(("  per-item overhead (pytest, hooks, records, report)", counts["items_wall"] - phase_sum,
                     float("nan")))
        rows.append(("items, all of the above", counts["items_wall"], counts["items_cpu"]))
        rows.append(("between items and at the end (idle, xdist)", *_minus(mark_span(proc, "numba_imported",
                                                                                  "sessionfinish_start"),
                                                                            (counts["items_wall"], counts["items_cpu"]))))
    else:
        rows.append(("workers running (controller: scheduling, reports)", *mark_span(proc, "collected",
                                                                                 "sessionfinish_start")))
    rows.append(("sessionfinish (files written, workers stopped)", *mark_span(proc, "sessionfinish_start",
                                                                          "sessionfinish_done")))
    rows.append(("unconfigure", *mark_span(proc, "unconfigure_start", "unconfigure_done")))
    if end_wall is not None:
        rows.append(("teardown (interpreter exit)", end_wall - marks["unconfigure_done"][0], float("nan")))
    return rows


def _minus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] - b[0], a[1] - b[1]


def print_breakdown(run: dict[str, Any]) -> None:
    procs = run["processes"]
    names = sorted(procs, key=lambda n: (n != "main", n))
    tables = {n: breakdown(procs[n], run["end"] if n == "main" else None) for n in names}
    print(f"  {'step (wall s / CPU s)':52}" + "".join(f"{n:>16}" for n in names))
    for step in dict.fromkeys(row[0] for n in sorted(names, key=lambda n: -len(tables[n])) for row in tables[n]):
        cells = []
        for n in names:
            row = next((r for r in tables[n] if r[0] == step), None)
            cells.append(f"{'':>16}" if row is None else f"{row[1]:>8.2f}" + (
                f"{'':>8}" if math.isnan(row[2]) else f"{row[2]:>8.2f}"))
        print(f"  {step:52}" + "".join(cells))
    print(f"  {'items run':52}" + "".join(f"{procs[n]['counts']['items']:>16.0f}" for n in names))
    totals = [f"{procs[n]['marks']['unconfigure_done'][1]:>16.2f}" for n in names]
    print(f"  {'process CPU (to unconfigure)':52}" + "".join(totals))


def print_steps(run: dict[str, Any]) -> None:
    """With --detail: what each process's items' thread spent per step, per item and in all (the
    hooks of pytest's protocol hold every plugin's work; the indented steps lie inside check_entry)."""
    for name, proc in sorted(run["processes"].items()):
        steps, items = proc.get("steps") or {}, proc["counts"]["items"]
        if not steps:
            continue
        print(f"\n  {name}: {'the items' if items else 'the main'} thread, step by step ({items:.0f} items)")
        print(f"  {'step':58}{'calls':>8}{'wall s':>9}{'CPU s':>9}{'ms/item':>9}{'longest':>9}")
        for step, (calls, wall, cpu, longest) in sorted(steps.items(), key=lambda kv: -kv[1][1]):
            per_item = f"{wall / items * 1e3:>9.2f}" if items else f"{'-':>9}"
            print(f"  {step:58}{calls:>8.0f}{wall:>9.3f}{cpu:>9.3f}{per_item}{longest:>9.3f}")
