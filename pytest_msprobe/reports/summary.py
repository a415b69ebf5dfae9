"""What a person or a CI system reads about records: failure lines, worst failures, JUnit properties
(the session's terminal lines, which also read the pytest config, are session/terminal.py)."""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..records.record import Record, Row

WORST_SHOWN = 10


def shorten(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: cut at a word boundary where one is near, with an ellipsis
    saying that it was cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ;,:") + "…"


def _values(record: Record, key: str) -> list[float]:
    values = []
    for out in record.outputs:
        value = out.metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
            values.append(float(value))
    return values


def key_metrics(record: Record) -> dict[str, float]:
    """min/max cosine and the largest max-abs error over the item's outputs (absent ones left out)."""
    result: dict[str, float] = {}
    cosine, abs_err = _values(record, "cosine"), _values(record, "max_abs_err")
    if cosine:
        result["min_cosine"], result["max_cosine"] = min(cosine), max(cosine)
    if abs_err:
        result["max_abs_err"] = max(abs_err)
    return result


def junit_properties(record: Record) -> list[tuple[str, object]]:
    """The record's JUnit <property> elements: status, algorithms, key metrics, seed, the item it reused."""
    props: list[tuple[str, object]] = [("msprobe_status", record.status)]
    algorithms = dict.fromkeys(str(out.algorithm) for out in record.outputs if out.algorithm)  # per output, in order
    if algorithms:
        props.append(("msprobe_algorithm", ",".join(algorithms)))
    props += [(f"msprobe_{k}", f"{v:.6g}") for k, v in key_metrics(record).items()]
    if record.seed is not None:
        props.append(("msprobe_seed", record.seed))
    if record.reused_from:  # msprobe_filter_api
        props.append(("msprobe_reused_from", record.reused_from))
    return props


_SEVERITY = {"error": 0, "Warning": 1, "SKIP": 2, "pass": 3}


def severity(out: Row) -> int:
    """Sort key of an output by its verdict: error, Warning, SKIP, pass."""
    return _SEVERITY.get(str(out.verdict or out.status), 4)


def short_name(name: str, direction: str) -> str:
    """'Functional.linear.0.forward.output.0' -> 'output.0' (the API is already named)."""
    marker = f".{direction}."
    cut = name.rfind(marker)
    return name[cut + len(marker):] if cut >= 0 else name


def output_reasons(out: Row) -> list[str]:
    """Why an output got its verdict: the selected standard's message, then msprobe's Layer-1 message when
    Layer 1 did not pass and says something else (e.g. which original check a fallback verdict applied)."""
    verdict_message = out.verdict_message.strip()
    message = out.message.strip()
    texts = [verdict_message] if verdict_message else []
    if message and message != verdict_message:
        if not verdict_message:
            texts.append(message)
        elif out.status in ("error", "Warning"):
            texts.append(f"original standard (Layer 1) {out.status}: {message}")
    return texts


def reason(record: Record, every: bool = True) -> str:
    """One line saying why an item got its status: its worst output's reasons (`every=False`: the first, the
    selected standard's), else its message."""
    direction = record.direction
    for out in sorted(record.outputs, key=severity):
        texts = output_reasons(out) if (out.verdict or out.status) not in ("pass", None) else []
        if texts:
            texts = texts if every else texts[:1]
            return f"{short_name(out.name, direction)}: " + "; ".join(" ".join(t.split()) for t in texts)
    return " ".join(record.message.split()) or record.status


def label(record: Record) -> str:
    """The item as pytest names it (dump and entry), for records that have no node id the API name."""
    return str(record.nodeid or f"{record.api}.{record.direction}")


def worst(records: Iterable[Record], n: int = WORST_SHOWN) -> list[str]:
    """Failed items, lowest cosine first, then largest error; those without metrics (crash, exception) last.
    Each is named by its node id, so the dump it came from is known."""
    def rank(rec: Record) -> tuple[int, float, float]:
        m = key_metrics(rec)
        return (0 if m else 1, m.get("min_cosine", 1.0), -m.get("max_abs_err", 0.0))

    lines = []
    for rec in sorted((r for r in records if r.status == "error"), key=rank)[:n]:
        m = key_metrics(rec)
        numbers = "  ".join(f"{k}={v:.6g}" for k, v in m.items() if k != "max_cosine")
        lines.append(f"{label(rec)}  {numbers or shorten(reason(rec), 120)}".rstrip())
    return lines


def warned_lines(records: Iterable[Record], every: bool = False, n: int = WORST_SHOWN) -> list[str]:
    """Items passed with msprobe's Warning and why, as pytest's short summary writes its lines
    (every one with -rA / -rp, else the first n)."""
    warned = [r for r in records if r.status == "Warning"]
    if not warned:
        return []
    more = "" if every or len(warned) <= n else f"; the first {n}, -rA lists all"
    lines = [f"warned items ({len(warned)}, passed; -o msprobe_warning_as_error=true fails them{more}):"]
    return lines + [f"WARNED {label(r)} - {reason(r)}" for r in (warned if every else warned[:n])]


def nothing_checked(records: Sequence[Record]) -> str | None:
    """The line that fails a run whose every API item was skipped: a gate that checked nothing is not green."""
    if not records or any(r.status != "SKIP" for r in records):
        return None
    which = f"all {len(records)} API items were" if len(records) > 1 else "the only API item was"
    return (f"msprobe: {which} skipped, so nothing was checked (e.g. "
            f"{shorten(reason(records[0]), 160)}): exit status 1; -o msprobe_allow_all_skipped=true "
            "(ini key msprobe_allow_all_skipped) accepts such a run")


def skip_reason(record: Record, entry_name: str) -> str:
    """A skipped item's reason as pytest's `-rs` line prints it, after the dump's path: named by its entry. A
    message that starts with the call's own name (`Torch.foo: no such API ...`) starts with the entry instead."""
    return skip_message(record.message, entry_name)


def skip_message(message: str | None, entry_name: str) -> str:
    """`skip_reason` of a message alone: a skipped `[fuzz]` item's result is no record."""
    message = str(message or "skipped").strip()
    head, sep, rest = message.partition(": ")
    if sep and entry_name.startswith(head) and entry_name[len(head):len(head) + 1] in ("", ".", "["):
        return f"{entry_name}: {rest}"
    if message.startswith(entry_name):
        return message
    return f"{entry_name}: {message}"


# What a group of skips shares, how its messages say it (those the checks write), and what to do about it.
SKIP_GROUPS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("MindSpore is not installed", re.compile(r"^MindSpore is not installed"),
     "pip install mindspore; a tensor dump is checked without it (--msprobe-mode replay)"),
    ("unknown API, not in the installed torch", re.compile(r"no such API in torch"),
     "dumped with another torch version? check with the one the model ran on"),
    ("NPU op without a bench function", re.compile(r"no bench function for"),
     "register one (bench_functions.register in a conftest.py beside the dump)"),
    ("MindSpore API without a torch counterpart",
     re.compile(r"no torch counterpart|not in the MindSpore -> torch table|has no torch bench"),
     "map it in api_specs/mindspore.yaml, or under mindspore: in --msprobe-specs"),
    ("missing tensor file", re.compile(r"tensor file .* is missing|not saved in dump_tensor_data/"),
     "the dump's dump_tensor_data/ folder is incomplete: copy it whole with its dump.json"),
    ("not implemented on the device", re.compile(r"^not implemented on the device"),
     "no kernel for the call or its dtype: a device limit, not a precision result"),
    ("skipped by msprobe_specs", re.compile(r"\(msprobe_specs\)$"), "as that file says"),
    ("replay needs a tensor dump", re.compile(r"^--msprobe-mode replay compares"),
     "give it a tensor dump, or re-run the calls (--msprobe-mode rerun)"),
)
SKIP_GROUPS_SHOWN = 8
SKIP_NAMES_SHOWN = 3


def _skip_group(record: Record) -> tuple[str, str]:
    """(group, advice) of a skipped item: a known group, else its message without the call's own name."""
    message = " ".join(str(record.message or "skipped").split())
    for label_, pattern, advice in SKIP_GROUPS:
        if pattern.search(message):
            return label_, advice
    head, sep, rest = message.partition(": ")
    api_type = record.api.split(".", 1)[0]
    if sep and api_type and head.startswith(f"{api_type}."):
        message = rest
    return shorten(message, 100), ""


def _api_of(record: Record) -> str:
    """`Torch.foo` of Torch.foo.0: the API without its call's index."""
    api = str(record.api or "?")
    head, _, index = api.rpartition(".")
    return head if head and index.isdigit() else api


def skip_lines(records: Iterable[Record]) -> list[str]:
    """The skipped items grouped by reason, each group with its count, the first APIs and what to do: a skip
    says nothing about precision, and the run still passes, so the summary says why, not only how many."""
    groups: dict[tuple[str, str], list[str]] = {}
    for rec in records:
        if rec.status == "SKIP":
            groups.setdefault(_skip_group(rec), []).append(_api_of(rec))
    if not groups:
        return []
    total = sum(len(apis) for apis in groups.values())
    lines = [f"skipped {total} item(s), by reason (pytest -rs names each item):"]
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))  # most first; ties in the order met
    for (group, advice), apis in ranked[:SKIP_GROUPS_SHOWN]:
        names = list(dict.fromkeys(apis))
        shown = ", ".join(names[:SKIP_NAMES_SHOWN]) + (", …" if len(names) > SKIP_NAMES_SHOWN else "")
        lines.append(f"  {group} ({len(apis)}: {shown})" + (f": {advice}" if advice else ""))
    rest = ranked[SKIP_GROUPS_SHOWN:]
    if rest:
        lines.append(f"  … {sum(len(apis) for _, apis in rest)} more in {len(rest)} other group(s) of reasons")
    return lines


def file_lines(written: Mapping[str, Any], shown: int = 3) -> list[str]:
    """The files of a run; per-dump CSV sets (keys `<kind>:<label>`) for the first `shown` dumps."""
    plain = [f"{kind}: {path}" for kind, path in written.items() if ":" not in kind]
    per_dump: dict[str, list[str]] = {}
    for kind, path in written.items():
        if ":" in kind:
            per_dump.setdefault(kind.split(":", 1)[1], []).append(getattr(path, "name", str(path)))
    if not per_dump:
        return plain
    first = next(p for k, p in written.items() if ":" in k)
    lines = [f"one CSV set per dump ({len(per_dump)} dumps) in {getattr(first, 'parent', '')}:"]
    for name, files in list(per_dump.items())[:shown]:
        lines.append(f"  {name}: {', '.join(files)}")
    if len(per_dump) > shown:
        lines.append(f"  ... and {len(per_dump) - shown} more set(s) named the same way")
    return lines + plain
