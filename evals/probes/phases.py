"""The phases of a record's `timings`, summed as the benchmarks and the run probe sum them: one definition, so
the probe's per-process phase sums and the benchmarks' per-run sums are the same figures."""
from __future__ import annotations

PHASES = ("inputs", "device", "bench", "reference", "compare")


def add_phases(sums: dict[str, float], t: dict[str, float]) -> None:
    """Add one record's `timings` to per-phase sums (each backward pass in its side's phase); a bench that ran
    beside the items' thread (`bench_wait_s` in the timings) is also summed as "bench_beside", and its side,
    made there too (`inputs_beside_s`), as "inputs_beside"."""
    if "bench_wait_s" in t:
        sums["bench_beside"] = sums.get("bench_beside", 0.0) + t.get("bench_s", 0.0) + t.get("bench_backward_s", 0.0)
    sums["inputs_beside"] = sums.get("inputs_beside", 0.0) + t.get("inputs_beside_s", 0.0)
    sums["inputs"] += t.get("inputs_s", 0.0) + t.get("inputs_beside_s", 0.0)
    sums["device"] += t.get("device_s", 0.0) + t.get("device_backward_s", 0.0)
    sums["bench"] += t.get("bench_s", 0.0) + t.get("bench_backward_s", 0.0)
    sums["reference"] += sum(v for k, v in t.items() if k.startswith("reference"))
    sums["compare"] += t.get("compare_s", 0.0)  # the checks alone


def on_thread(p: dict[str, float], keys: tuple[str, ...] = PHASES) -> float:
    """The phases `keys` as the items' thread spent them: a bench run beside it, and its side, are left out."""
    return sum(p[k] - p.get(f"{k}_beside", 0.0) for k in keys)
