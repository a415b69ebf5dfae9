"""ini `msprobe_keep_runs` N: each run writes one set of result files stamped `<ts>` into `--msprobe-out`
(results.py); after writing, the controller keeps the newest N sets and removes the older ones.

A set is every file named `<msprobe prefix><14-digit ts>[_<dump label>].csv|jsonl` with the same stamp
(the result and details CSVs, per dump too, the MindSpore and api_precision_compare files, the JSON
lines records). Nothing else in the folder is touched: not the journal, not `repro/`, not a file of
another name. Stamps order chronologically, so the newest are the largest.
"""
from __future__ import annotations

import re
from pathlib import Path

DEFAULT_KEEP = 10
_SET_FILE = re.compile(r"(?:accuracy_checking_result_|accuracy_checking_details_|msprobe_records_|"
                       r"api_precision_compare_result_|api_precision_compare_details_)"
                       r"(\d{14})(?:_[A-Za-z0-9_.\-]+)?\.(?:csv|jsonl)")


def result_sets(out_dir: Path) -> dict[str, list[Path]]:
    """{stamp: its files} of the result sets in out_dir, oldest first."""
    sets: dict[str, list[Path]] = {}
    if Path(out_dir).is_dir():
        for path in Path(out_dir).iterdir():
            match = _SET_FILE.fullmatch(path.name)
            if match and path.is_file():
                sets.setdefault(match.group(1), []).append(path)
    return dict(sorted(sets.items()))


def keep_newest(out_dir: Path, keep: int) -> tuple[list[str], list[str]]:
    """Remove every result set but the newest `keep` (0: keep all); returns (kept stamps, removed stamps)."""
    sets = result_sets(out_dir)
    stamps = list(sets)
    if keep <= 0 or len(stamps) <= keep:
        return stamps, []
    removed = stamps[:-keep]
    for stamp in removed:
        for path in sets[stamp]:
            path.unlink(missing_ok=True)
    return stamps[-keep:], removed


def summary_line(out_dir: Path, keep: int, kept: list[str], removed: list[str]) -> str:
    """What the terminal says about the sets in out_dir."""
    policy = f"the newest {keep} are kept (msprobe_keep_runs={keep})" if keep > 0 else \
        "all are kept (msprobe_keep_runs=0)"
    line = f"result sets in {out_dir}: {len(kept)}, {policy}"
    if removed:
        shown = ", ".join(removed[:5]) + (f" and {len(removed) - 5} more" if len(removed) > 5 else "")
        line += f"; removed {len(removed)} older set(s): {shown}"
    return line
