"""Evidence pooled over the calls of one API, where each call alone holds too little of it.

An optimizer updates every parameter with the same in-place op, dozens of times a step, and many of those calls
are a bias of 4 or 16 elements: a kernel that rounds every result toward zero leaves 4 of 4 elements one ULP
low, which one call cannot tell from chance (the sign test over its wrongly rounded elements needs more of
them, and the bias test needs `min_elements`). Over the run's calls of the same API, direction, output and
dtype, the same tests see it:

* the sign test over the wrongly rounded elements of the calls that passed (rules.py's, on their sums): a
  kernel rounding toward zero or upward leans every one of them the same way; a correct kernel's other
  rounding of a scalar at a tie leans either way;
* the bias test over the calls too small for their own (rules.py `small_means`): each call's mean signed error
  towards zero is one observation, held against the torch run's, as rows are within one call.

A pool that fails is one failed item, reported on the controller after every call was checked (or resumed),
naming its calls. Pure: records in, verdicts out (numpy only for the t-test).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..records.record import Record

POOLED = "pooled"  # a pooled item's name says so in its brackets; it is not an API call and is never run alone


@dataclass
class Pool:
    """The calls of one API whose output `output` (its position) has dtype `dtype`, and what they add up to."""

    api: str  # the API without its call index: "Tensor.add_"
    direction: str
    output: int
    dtype: str
    calls: list[str] = field(default_factory=list)  # the calls' names ("Tensor.add_.3"), in the run's order
    dumps: list[str] = field(default_factory=list)
    wrong: int = 0
    wrong_zero: int = 0
    wrong_up: int = 0
    elements: int = 0
    # the calls too small for a bias test of their own: (device's mean, torch run's mean, least bias there)
    small: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The pooled item's name: the API's entries' form, the pool in brackets (as a fuzz item's)."""
        return f"{self.api}.{self.direction}[{POOLED} {self.dtype.removeprefix('torch.')} output {self.output}]"


@dataclass(frozen=True)
class PooledVerdict:
    """A pool's verdict: `message` says what leans, over which calls."""

    pool: Pool
    status: str  # "pass" | "error"
    message: str
    stats: dict[str, float]


def pools(records: Iterable[Record], standard: str | None = None) -> list[Pool]:
    """The strict records' passed float rows, by API, direction, output and dtype (pools of two calls or more);
    `standard`: the run's, for records that do not name theirs (an in-process block's)."""
    by_key: dict[tuple[str, str, int, str], Pool] = {}
    for record in records:
        if (record.standard or standard) != "strict" or record.status == "SKIP" or is_pooled(record) \
                or record.reused_from:  # a repeated call's record is its first call's: no evidence of its own
            continue
        api = record.api.rpartition(".")[0] or record.api
        for position, row in enumerate(record.outputs):
            # a row judged again by another check (validity, backward error) passed by it, not by its elements
            stats = row.reference if row.verdict == "pass" and row.check is None else None
            if not stats or "wrong" not in stats:
                continue
            pool = by_key.setdefault((api, record.direction, position, row.device_dtype),
                                     Pool(api, record.direction, position, row.device_dtype))
            pool.calls.append(record.api)
            if record.dump and record.dump not in pool.dumps:
                pool.dumps.append(record.dump)
            pool.wrong += int(stats["wrong"])
            pool.wrong_zero += int(stats["wrong_zero"])
            pool.wrong_up += int(stats["wrong_up"])
            pool.elements += math.prod(row.shape or ())
            if "small_bias_zero" in stats:
                pool.small.append((float(stats["small_bias_zero"]), float(stats["small_ref_bias_zero"]),
                                   float(stats["small_bias_min_ulp"])))
    return [pool for pool in by_key.values() if len(pool.calls) > 1]


def judge(pool: Pool, rules: Mapping[str, Any]) -> PooledVerdict:
    """The pooled sign and bias tests, by the API's strict rules: `pool_t` (the limit of both statistics: one
    test per API and dtype of a run, not one per output), `pool_min_calls`, `bias_ref_factor`."""
    import numpy as np

    from .strict.rules import direction, sign_z, t_statistic

    limit, least = float(rules["pool_t"]), int(rules["pool_min_calls"])
    n = pool.wrong
    lean = sign_z(n, pool.wrong_zero, pool.wrong_up)
    stats = {"calls": float(len(pool.calls)), "wrong": float(n), "wrong_lean_z": float(lean)}
    problems = []
    if lean > limit:
        problems.append(f"{n} wrongly rounded elements of {pool.elements} in {len(pool.calls)} calls, "
                        f"{pool.wrong_zero} toward zero and {pool.wrong_up} upward (sign test {lean:.3g}, "
                        f"limit {limit:.3g})")
    if len(pool.small) >= least:
        device, ref, floor = (np.array(column, dtype=np.float64) for column in zip(*pool.small))
        ones = np.ones(len(pool.small))
        (mean, t_dev), (ref_mean, t_ref) = t_statistic(device, ones, least), t_statistic(ref, ones, least)
        stats.update(small_calls=float(len(pool.small)), bias_zero=mean, bias_zero_t=t_dev, ref_bias_zero=ref_mean,
                     ref_bias_zero_t=t_ref)
        t_limit = max(limit, float(rules["bias_ref_factor"]) * abs(t_ref))
        size_limit = float(floor.max()) + abs(ref_mean)
        if abs(t_dev) > t_limit and abs(mean) > size_limit:
            problems.append(f"the {len(pool.small)} calls too small for their own bias test are biased "
                            f"{direction('bias_zero', mean)}: {abs(mean):.3g} ULP on average (limit "
                            f"{size_limit:.3g} ULP; torch run: {abs(ref_mean):.3g}), t-statistic {abs(t_dev):.3g} > "
                            f"{t_limit:.3g} over the calls")
    if not problems:
        return PooledVerdict(pool, "pass", "", stats)
    shown = ", ".join(pool.calls[:8]) + (f" and {len(pool.calls) - 8} more" if len(pool.calls) > 8 else "")
    return PooledVerdict(pool, "error", f"pooled over the calls that each passed alone ({shown}): "
                                        + "; ".join(problems), stats)


def failed_records(records: Iterable[Record], specs: Mapping[str, Any], standard: str | None = None) -> list[Record]:
    """The records of the pools that fail (`failed`), as the reports list them."""
    return [record_of(v) for v in failed(records, specs, standard)]


def failed(records: Iterable[Record], specs: Mapping[str, Any], standard: str | None = None) -> list[PooledVerdict]:
    """The pools that fail, by the strict rules of `specs` for each pool's API and dtype (`standard`: as pools')."""
    from ..specs.loader import error_kind, thresholds_for
    from .judge import element_rules

    def rules(pool: Pool) -> Mapping[str, Any]:
        return element_rules(thresholds_for(specs, pool.api)["strict"], pool.dtype, error_kind(pool.api, specs))

    verdicts = [judge(pool, rules(pool)) for pool in pools(records, standard)]
    return [v for v in verdicts if v.status == "error"]


def is_pooled(record: Record) -> bool:
    """Whether the record is a pooled item's (record_of)."""
    return f"[{POOLED} " in record.api


def record_of(verdict: PooledVerdict) -> Record:
    """The pooled item's record, as the reports list it: its API is the pool's name without the direction."""
    pool = verdict.pool
    api = pool.name.replace(f".{pool.direction}[", "[", 1)
    dump = pool.dumps[0] if pool.dumps else None
    return Record(api, pool.direction, 0, status=verdict.status, message=verdict.message,
                  notes=[f"calls: {', '.join(pool.calls)}"], standard="strict", nodeid=f"{dump or 'msprobe'}::{pool.name}",
                  dump=dump)

