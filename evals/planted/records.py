"""Reading the records of planted runs: the dump's dtype, what an item's records say (effective, flagged,
messages) and the lines of missed bugs and false alarms. Shared by planted_bugs.py and planted_fused.py."""
from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

FLOAT_DTYPES = ("torch.bfloat16", "torch.float16", "torch.float32")


def dump_dtype(path: Path) -> str:
    """The dump's dominant float output dtype (the dtype the arms apply to)."""
    data = json.loads(path.read_text())["data"]
    counts: collections.Counter[str] = collections.Counter()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("dtype") in FLOAT_DTYPES:
                counts[node["dtype"]] += 1
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for name, entry in data.items():  # outputs: an autocast step's dtype is its kernels' output dtype
        if name.endswith(".forward") and isinstance(entry, dict):
            walk(entry.get("output"))
    return counts.most_common(1)[0][0] if counts else "torch.float32"


def reference_stats(rec: dict[str, Any]) -> list[Any]:
    """Each output's error statistics against the reference, for the JSON rows."""
    return [{k: (o.get("reference") or {}).get(k) for k in ("max_err", "mean_err", "ref_mean_err", "bias", "bias_zero")}
            for o in rec.get("outputs", [])]


def record_message(rec: dict[str, Any]) -> str:
    """The record's message and those of its failing outputs, in one line."""
    return "; ".join(filter(None, [rec.get("message", "")] + [
        f"{o['name']}: {o.get('verdict_message') or o.get('message')}" for o in rec.get("outputs", [])
        if (o.get("verdict") or o.get("status")) in ("error", "Warning")] + [rec.get("pooled", "")]))


def fingerprint(rec: dict[str, Any]) -> list[Any]:
    """Every output's metrics: an arm was effective on an item when they differ from the clean run's."""
    return [sorted((k, v) for k, v in (o.get("metrics") or {}).items() if v is not None) for o in rec.get("outputs", [])]


def flagged(rec: dict[str, Any], key: str) -> bool:
    """Whether the verdict under `key` (status, layer1_status) flags the item; under status, a failing pool of
    its API's calls (verdict/pooled.py) flags each of them too."""
    return rec.get(key) in ("error", "Warning") or (key == "status" and bool(rec.get("pooled")))


def api_keyword(arm: Any) -> str | None:
    """A `-k` expression for the APIs the arm replaces (None: it replaces every API)."""
    names = set()
    for fn in arm.impls:
        if fn == "*":
            return None
        names.add(getattr(fn, "__name__", str(fn)).strip("_").removeprefix("linalg_")
                  .replace("scaled_dot_product_attention", "attention"))
    return " or ".join(sorted(names))


def print_misses(rows: list[dict[str, Any]], standard: str, width: int) -> None:
    """Every missed bug and false alarm under `standard`, a line each (its message cut to `width`)."""
    misses = [r for r in rows if r["standard"] == standard and (r["kind"] == "bug") != bool(r["flagged"])]
    if misses:
        print(f"\n## {standard}: missed bugs and false alarms\n")
        for r in misses:
            print(f"- {r['kind']} {r['arm']} {r['dump']} {r['item']}: {r['message'][:width]}")
