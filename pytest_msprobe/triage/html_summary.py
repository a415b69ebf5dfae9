"""Parts of the --msprobe-html page that read the records as a whole: the devices the items ran on, the dump
of each item, what judged each item under the strict standard, and the summary by API and status above the
table of items."""
from __future__ import annotations

import html
from collections.abc import Sequence
from urllib.parse import quote

from ..records.record import Record
from ..reports.results import dump_folders

STATUSES = ("error", "Warning", "pass", "SKIP")


def devices_used(records: Sequence[Record], configured: str) -> str:
    """The devices the items ran on (what --msprobe-device auto chose), or the configured one when none ran."""
    ran = sorted({r.device for r in records if r.device})
    if not ran:
        return configured
    return ", ".join(ran) + (f" (--msprobe-device {configured})" if configured not in ran else "")


def dump_names(dumps: Sequence[str]) -> dict[str, str]:
    """{dump path: the `dump` cell}: its folder past the folders all dumps share (`step0/rank1`, as the CSV sets
    are named), so the same call in two dumps reads apart; with one dump, its folder as the run named it."""
    return {dump: folder or dump.replace("\\", "/").removesuffix("/dump.json")
            for dump, folder in dump_folders(dumps).items()}


def judged_by(rec: Record, kind: str) -> str:
    """The item's `algorithm` cell. Under strict, the float outputs strict judged (they carry its reference
    figures) read `strict <kind of op>` (api_specs/error_model.yaml): msprobe's algorithm names (ulp_compare,
    absolute_threshold), which its own standards use, did not judge them. Other outputs keep theirs."""
    names = []
    for out in rec.outputs:
        if rec.standard == "strict" and out.reference:
            names.append(f"strict {kind}")
        elif out.algorithm:
            names.append(str(out.algorithm))
    return ",".join(dict.fromkeys(names)) or ("overflow" if rec.overflow else "")


def api_of(rec: Record) -> str:
    """`Functional.linear` of `Functional.linear.3`: the API, whichever call."""
    api = str(rec.api or "?")
    head, _, tail = api.rpartition(".")
    return head if head and tail.isdigit() else api


def summary_table(records: Sequence[Record]) -> str:
    """Items per API and status, failing APIs first (a 268-row all-pass report reads as a dozen lines); each API
    name filters the table below to its items."""
    counts: dict[str, dict[str, int]] = {}
    for rec in records:
        row = counts.setdefault(api_of(rec), {})
        status = str(rec.status or "")
        row[status] = row.get(status, 0) + 1
    if not counts:
        return ""
    order = sorted(counts, key=lambda a: (-counts[a].get("error", 0), -counts[a].get("Warning", 0), a))
    head = "".join(f"<th>{s}</th>" for s in ("API", "items", *STATUSES))
    rows = []
    for api in order:
        row = counts[api]
        cells = "".join(f'<td class="num s-{s}">{row.get(s, 0) or ""}</td>' for s in STATUSES)
        link = f'<a href="#q={quote(api + ".")}">{html.escape(api)}</a>'
        rows.append(f'<tr data-api="{html.escape(api)}"><td>{link}</td><td class="num">{sum(row.values())}</td>'
                    f"{cells}</tr>")
    return (f'<h2>Summary by API</h2><table class="summary" id="summary"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")
