"""What a person or a CI system reads about a run: terminal summary lines and JUnit properties."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

WORST_SHOWN = 10


def _values(record: Mapping[str, Any], key: str) -> list[float]:
    values = []
    for out in record.get("outputs") or ():
        value = (out.get("metrics") or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            values.append(float(value))
    return values


def key_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """min/max cosine and the largest max-abs error over the item's outputs (absent ones left out)."""
    result: dict[str, float] = {}
    cosine, abs_err = _values(record, "cosine"), _values(record, "max_abs_err")
    if cosine:
        result["min_cosine"], result["max_cosine"] = min(cosine), max(cosine)
    if abs_err:
        result["max_abs_err"] = max(abs_err)
    return result


def junit_properties(record: Mapping[str, Any]) -> list[tuple[str, object]]:
    props: list[tuple[str, object]] = [("msprobe_status", record.get("status", ""))]
    algorithms = dict.fromkeys(str(a) for a in [record.get("algorithm")] + [
        out.get("algorithm") for out in record.get("outputs") or ()] if a)  # per output, in order
    if algorithms:
        props.append(("msprobe_algorithm", ",".join(algorithms)))
    props += [(f"msprobe_{k}", f"{v:.6g}") for k, v in key_metrics(record).items()]
    if record.get("seed") is not None:
        props.append(("msprobe_seed", record["seed"]))
    if record.get("reused_from"):  # --msprobe-filter-api
        props.append(("msprobe_reused_from", record["reused_from"]))
    return props


def worst(records: Iterable[Mapping[str, Any]], n: int = WORST_SHOWN) -> list[str]:
    """Failed items, lowest cosine first, then largest error; those without metrics (crash, exception) last."""
    def rank(rec: Mapping[str, Any]) -> tuple[int, float, float]:
        m = key_metrics(rec)
        return (0 if m else 1, m.get("min_cosine", 1.0), -m.get("max_abs_err", 0.0))

    lines = []
    for rec in sorted((r for r in records if r.get("status") == "error"), key=rank)[:n]:
        m = key_metrics(rec)
        numbers = "  ".join(f"{k}={v:.6g}" for k, v in m.items() if k != "max_cosine")
        message = str(rec.get("message") or "").strip().splitlines()
        lines.append(f"{rec['api']}.{rec['direction']}  {numbers or (message[0][:120] if message else '')}".rstrip())
    return lines


def header_lines(config: Any) -> list[str]:
    from .devices import DEVICES_KEY
    from .journal import JOURNAL_KEY

    lines = []
    if DEVICES_KEY in config.stash:
        lines.append(config.stash[DEVICES_KEY].header())
    journal = config.stash.get(JOURNAL_KEY, None)
    if journal is not None and journal.resume:
        lines.append(f"msprobe: resuming from {journal.path}: {len(journal.finished)} finished item(s) there")
    from .workers import header_line

    if header_line(config):
        lines.append(header_line(config))
    if config.getoption("msprobe_shard"):
        lines.append("msprobe: shard {}/{} of every dump".format(*config.getoption("msprobe_shard")))
    return lines


def terminal_lines(config: Any, records: list[dict[str, Any]], written: Mapping[str, Any],
                   resumed: int, known: int) -> list[str]:
    """Counts by status, where results came from, devices, the worst failures, the files."""
    from .devices import DEVICES_KEY
    from .guard import CRASH_KEY
    from .journal import JOURNAL_KEY
    from .report import summary_counts
    from .settings import SETTINGS_KEY

    counts = summary_counts(records)
    lines = ["items: " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))]
    notes = []
    if resumed:
        notes.append(f"{resumed} taken from the journal (--msprobe-resume)")
    if known:
        notes.append(f"{known} known failure(s) xfailed by the baseline")
    reused = sum(1 for r in records if r.get("reused_from"))
    if reused:
        notes.append(f"{reused} reused the result of an identical call (--msprobe-filter-api)")
    crash = config.stash.get(CRASH_KEY, None)
    if crash is not None and crash.crashed:
        notes.append(f"{crash.crashed} crashed or hung item(s)")
    if notes:
        lines.append("; ".join(notes))
    info = config.stash.get(DEVICES_KEY, None)
    if info is not None:
        ran_on = sorted({str(r.get("device")) for r in records if r.get("device")})
        where = info.hooks.summary() if info.hooks is not None else str(info.slot)
        lines.append(f"devices: {where}; items ran on {', '.join(ran_on) or '-'}")
    bad = worst(records)
    if bad:
        lines.append(f"worst failures ({len(bad)} of {counts.get('error', 0)}):")
        lines += [f"  {line}" for line in bad]
    lines.append(f"seed: {config.stash[SETTINGS_KEY].check_options.run_seed}")
    lines += [f"{kind}: {path}" for kind, path in written.items()]
    journal = config.stash.get(JOURNAL_KEY, None)
    if journal is not None:
        lines.append(f"journal: {journal.path}")
    return lines
