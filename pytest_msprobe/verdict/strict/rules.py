"""The `strict` standard (the default): what a correct kernel in the device dtype may lose, per kind of op.

Errors are measured against the bench in units of the device dtype: an output equal to the bench
correctly rounded to that dtype has zero error, so bf16, fp16 and fp32 are judged on the same footing.
The error scale of each element is one ULP of the rounded bench, raised to what a correct kernel may
lose there, by the op's kind (`api_specs/error_model.yaml`):

* elementwise (the default): exact inputs, so the output's own ULPs, or the error of torch's own
  kernel at that element (the *torch run*: the API on CPU in the device dtype) where torch loses more;
* exact (IEEE add, mul, div, sqrt, ...): as elementwise, and every element must be the correctly
  rounded result or torch's own;
* reduction (softmax, norms, losses, pooling, attention, sums): also the root mean square of the torch
  run's errors over the element's row (last dimension), so that a cancelled element is judged against
  the size of the terms of its row, not its own tiny ULPs (flash-style rounding of attention
  probabilities, another summation order);
* contraction (linear, matmul, conv, einsum): the size of the terms that produced the element (the
  *magnitude run*: the API on the absolute values of its inputs) times fp32 accumulation's unit
  roundoff: fp32 accumulation in any order or split passes, 16-bit accumulation fails.

A zero (of either sign) where the bench lies below the device dtype's normal range counts as the
correctly rounded result: flushing a subnormal result to zero is what NPUs, GPUs and 16-bit CPU dot
products do, not a bug.

Then these checks, all numbers in api_specs/thresholds.yaml (`strict:`):
1. NaN and inf sit where the rounded bench (or the torch run) has them, with the same signs.
2. No element is grossly wrong: normalised error <= gross.
3. The typical error is not larger than the torch run's: mean <= mean_ref_factor * its mean + slack.
4. The errors are not biased (in one direction, or towards zero as truncation is): a t-test over rows
   of the signed errors (in ULPs from the correctly rounded result, clipped to +-1), significant and
   larger than the torch run's bias.
5. Where error_model.yaml lists the op under `row_statistic` (norms, whose rstd scales a whole row):
   the mean error towards zero does not spread over rows much more than the torch run

This module holds the rules once: the quantities a pass totals (`Totals`), the limits it reads from the rules
mapping (`params`, in the P_* order every backend reads), the blocks and groups it works in (`plan`), and the
decision that combines the totals into a verdict (`judged`). The passes that compute the totals are the
backends (backends.py).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..grid import FORMATS, accumulation_roundoff, round_to, ulp

KINDS = ("elementwise", "exact", "reduction", "contraction")
ROW_KINDS = ("reduction", "contraction")  # kinds with a scale floor and, with a torch run, a row's RMS in the scale
# the float parameters of a pass (`params`), in this order in every backend
P_FLOOR, P_TORCH, P_ROW, P_EST, P_ACC, P_GROSS, P_EMIN, P_ULP, P_WINDOW, P_LEAF = range(10)
# the scalar totals of a pass, by name (Totals' fields), and the bias test's four group sums
TOTALS = ("sum_w", "sum_t", "max_t", "max_w", "worst", "gross", "wrong", "first_wrong", "wrong_zero", "wrong_up",
          "off_tie")
BIAS_KEYS = ("bias", "ref_bias", "bias_zero", "ref_bias_zero")
BLOCK = 1 << 15  # elements per block: a dozen temporaries of a block stay in cache


@dataclass
class StrictResult:
    status: str  # "pass" | "error"
    message: str
    stats: dict[str, float]


class Totals:
    """What the blocked pass accumulates: sums and maxima of the normalised errors, the first gross and
    wrongly rounded elements, and per-group sums of the signed errors for the bias test."""

    def __init__(self) -> None:
        self.sum_w = self.sum_t = self.max_t = 0.0
        self.max_w, self.worst, self.gross, self.wrong, self.first_wrong = -1.0, 0, 0, 0, -1
        self.wrong_zero = self.wrong_up = 0  # wrongly rounded elements below the correct |value|, above it
        self.wrong_off_tie = 0  # wrongly rounded elements whose exact value is not near a rounding tie
        self.bias: dict[str, list[np.ndarray]] = {k: [] for k in BIAS_KEYS}
        self.counts: list[np.ndarray] = []


def totals_of(got: Mapping[str, float], sums: np.ndarray, counts: np.ndarray) -> Totals:
    """A pass's totals (by name) and the bias test's group sums and sizes as a Totals."""
    acc = Totals()
    acc.sum_w, acc.sum_t, acc.max_t, acc.max_w = got["sum_w"], got["sum_t"], got["max_t"], got["max_w"]
    acc.worst, acc.gross, acc.wrong, acc.first_wrong, acc.wrong_zero, acc.wrong_up, acc.wrong_off_tie = (
        int(got[k]) for k in ("worst", "gross", "wrong", "first_wrong", "wrong_zero", "wrong_up", "off_tie"))
    acc.bias = {k: [sums[i]] for i, k in enumerate(BIAS_KEYS)}
    acc.counts = [counts]
    return acc


@dataclass
class Judged:
    """What the verdict needs of the output beside the totals: m elements judged, whether a torch run was,
    the device dtype, the worst element's flat index in the output, and `value_at(key, i)`: element i of
    the judged arrays' "d" (device) or "b" (bench) as a float."""
    m: int
    has_t: bool
    device_dtype: str
    index: int
    value_at: Callable[[str, int], float]


def judged(acc: Totals, rules: Mapping[str, Any], stats: dict[str, float], output: Judged) -> StrictResult:
    """The verdict from a pass's totals over the output's judged elements."""
    m, device_dtype, index, value_at = output.m, output.device_dtype, output.index, output.value_at
    reference = "torch run" if output.has_t else "correctly rounded"  # what the device is held against
    stats.update(max_err=acc.max_w, mean_err=acc.sum_w / m, ref_max_err=acc.max_t, ref_mean_err=acc.sum_t / m)
    problems = []
    # A few wrongly rounded elements may be a sound kernel's other rounding of a scalar operand: at a tie
    # (the exact value within the scalar's fp32 rounding of a midpoint). Many, ones off a tie, or ones that
    # all lean one way (truncation: toward zero; a sign test over them) are not.
    lean = sign_z(acc.wrong, acc.wrong_zero, acc.wrong_up)
    stats["wrong_lean_z"], stats["wrong_off_tie"] = float(lean), float(acc.wrong_off_tie)
    # the counts a pooled test over the API's calls adds up (verdict/pooled.py), where one call holds too few
    stats.update(wrong=float(acc.wrong), wrong_zero=float(acc.wrong_zero), wrong_up=float(acc.wrong_up))
    if acc.wrong > max(rules["exact_min_count"], rules["exact_max_fraction"] * m) or lean > rules["bias_t"] or \
            acc.wrong_off_tie > 0:
        d0, b0 = value_at("d", acc.first_wrong), value_at("b", acc.first_wrong)
        problems.append(f"not correctly rounded: {acc.wrong} of {m} elements differ from the correctly rounded "
                        f"result and from torch's, {acc.wrong_off_tie} away from a rounding tie, {acc.wrong_zero} toward "
                        f"zero and {acc.wrong_up} upward "
                        f"(sign test {lean:.3g}, limit {float(rules['bias_t']):.3g}; first: device {d0!r}, correctly "
                        f"rounded {float(round_to(np.array([b0]), device_dtype)[0])!r})")
    if acc.gross:
        d0, b0 = value_at("d", acc.worst), value_at("b", acc.worst)
        unit = float(ulp(round_to(np.array([b0]), device_dtype), device_dtype)[0])
        problems.append(f"gross error: {acc.gross} of {m} elements exceed {float(rules['gross']):.3g} scale units "
                        f"(worst {acc.max_w:.3g} scale units = {abs(d0 - b0) / unit:.3g} ULP, at flat index {index}: "
                        f"device {d0!r}, bench {b0!r})")
    if m >= rules["min_elements"]:
        mean_limit = rules["mean_ref_factor"] * stats["ref_mean_err"] + rules["mean_slack"]
        if stats["mean_err"] > mean_limit:
            problems.append(f"mean error: {stats['mean_err']:.3g} > limit {mean_limit:.3g} ({reference}: "
                            f"{stats['ref_mean_err']:.3g}), in scale units")
        problems += bias(acc, rules, stats, reference)
    else:  # too small for its own bias test: its mean signed errors, for the pooled one (verdict/pooled.py)
        small_means(acc, rules, stats)
    if problems:
        return StrictResult("error", "; ".join(problems), stats)
    return StrictResult("pass", "", stats)


def sign_z(wrong: int, toward_zero: int, upward: int) -> float:
    """The sign test over `wrong` wrongly rounded elements: how far the larger lean (toward zero or not, upward or
    not) sits from an even split, in standard deviations."""
    return max(abs(2 * k - wrong) for k in (toward_zero, upward)) / float(np.sqrt(max(wrong, 1)))


class Plan(NamedTuple):
    """A pass's blocks: elements per group, per block, every how many blocks the bias test samples, the scale floor."""
    size: int
    block: int
    every: int
    floor: float


def host_squares(bench: np.ndarray) -> float:
    """The bench's float64 sum of squares, as numpy adds it (einsum's buffers: streamed.Squares repeats them)."""
    return float(np.einsum("i,i->", bench, bench, dtype=np.float64))


def plan(flat: Mapping[str, Any], row: int, rules: Mapping[str, Any], kind: str,
         squares: Callable[[Any], float] = host_squares) -> Plan:
    """The blocks of a pass over `flat` (numpy arrays, or tensors with their backend's `squares`)."""
    m = size_of(flat["d"])
    floor = 0.0
    if kind in ROW_KINDS:  # below the bench's own resolution nothing is judged
        floor = floor_of(squares(flat["b"]), m, flat["b"].dtype.itemsize, rules)
    return Plan(*sizes(m, row, rules), floor)


def floor_of(squares: float, m: int, bench_itemsize: int, rules: Mapping[str, Any]) -> float:
    """A reduction's or contraction's scale floor: the bench's own resolution at its root mean square, from the sum
    of its m squares (`squares`, float64)."""
    bench_roundoff = 2.0 ** -24 if bench_itemsize <= 4 else 2.0 ** -53
    return float(rules["bench_factor"] * bench_roundoff * float(np.sqrt(squares / m)))


def sizes(m: int, row: int, rules: Mapping[str, Any]) -> tuple[int, int, int]:
    """plan's (elements per group, per block, every how many blocks the bias test samples) of m elements."""
    # groups of whole rows; a small output is cut into bias_min_groups blocks so the bias test can run
    size = min(groups(m, row, int(rules["row_min"])), max(1, m // int(rules["bias_min_groups"])))
    block = size * max(1, BLOCK // size)
    # the bias test samples every `every`-th block: about bias_max_samples elements, and at least
    # bias_min_groups blocks (each holds one group or more)
    blocks = -(-m // block)
    every = max(1, min(m // int(rules["bias_max_samples"]), blocks // int(rules["bias_min_groups"])))
    return size, block, every


def params(floor: float, rules: Mapping[str, Any], device_dtype: str, leaf_start: float) -> np.ndarray:
    """The pass's float parameters, in the P_* order (every backend reads the same)."""
    mantissa, emin = FORMATS[device_dtype]
    factor = {k: float(rules.get(k, 0.0)) for k in ("torch_factor", "row_factor", "estimated_row_factor",
                                                    "accumulation_factor", "exact_tie_factor")}
    return np.array([floor, factor["torch_factor"], factor["row_factor"], factor["estimated_row_factor"],
                     factor["accumulation_factor"] * accumulation_roundoff(device_dtype), rules["gross"],
                     2.0 ** emin, 2.0 ** -mantissa, factor["exact_tie_factor"] * 2.0 ** (mantissa - 24),
                     leaf_start])


def groups(n: int, row: int, min_size: int) -> int:
    """Elements per group: whole rows (the last dimension), merged until a group has min_size elements."""
    row = max(1, min(row, n))
    size = row * -(-min_size // row) if row < min_size else row
    return min(size, n)


def t_statistic(sums: np.ndarray, counts: np.ndarray, min_groups: int) -> tuple[float, float]:
    """(mean, t) of signed errors from their per-group sums: the t-test over group means, so rounding
    errors shared within a row (one normalisation factor per softmax row) are one observation, not a
    row's worth. Fewer than min_groups groups: no test (t = 0)."""
    total = float(counts.sum())
    mean = float(sums.sum()) / total if total else 0.0
    if counts.size < min_groups:
        return mean, 0.0  # too few rows for a test: no bias verdict
    means = sums / counts
    spread = float(np.std(means, ddof=1))
    if spread == 0.0:
        return mean, (0.0 if mean == 0.0 else float(np.copysign(np.inf, mean)))
    return mean, float(np.mean(means) / (spread / np.sqrt(means.size)))


def size_of(values: Any) -> int:
    """Elements of a numpy array or of a torch tensor."""
    return int(values.size) if isinstance(values, np.ndarray) else int(values.numel())


def bias(acc: Totals, rules: Mapping[str, Any], stats: dict[str, float], reference: str) -> list[str]:
    """Systematic shifts, in one direction or towards zero: significant over rows and larger than the
    torch run's own (`reference` names it in the message)."""
    problems = []
    counts = np.concatenate(acc.counts)
    min_groups = int(rules["bias_min_groups"])
    for key in ("bias", "bias_zero"):
        mean, t_dev = t_statistic(np.concatenate(acc.bias[key]), counts, min_groups)
        ref_mean, t_ref = t_statistic(np.concatenate(acc.bias[f"ref_{key}"]), counts, min_groups)
        stats[key], stats[f"{key}_t"], stats[f"ref_{key}"], stats[f"ref_{key}_t"] = mean, t_dev, ref_mean, t_ref
        t_limit = max(float(rules["bias_t"]), rules["bias_ref_factor"] * abs(t_ref))
        size_limit = rules["bias_min_ulp"] + abs(ref_mean)
        if abs(t_dev) > t_limit and abs(mean) > size_limit:
            problems.append(f"bias: errors biased {direction(key, mean)}: {abs(mean):.3g} ULP on average, each "
                            f"error clipped to ±1 ULP (limit {size_limit:.3g} ULP; {reference}: {abs(ref_mean):.3g} ULP "
                            f"{direction(key, ref_mean)}), t-statistic {abs(t_dev):.3g} > {t_limit:.3g}")
    problems += row_spread(acc, counts, rules, stats, reference)
    return problems


def small_means(acc: Totals, rules: Mapping[str, Any], stats: dict[str, float]) -> None:
    """The mean signed errors towards zero (clipped to +-1 ULP) of an output too small for the bias test, the
    device's and the torch run's, and the least mean that would count as a bias here (a contract raises it): each
    is one observation of the pooled test over the API's calls (verdict/pooled.py)."""
    counts = float(np.concatenate(acc.counts).sum()) if acc.counts else 0.0
    if counts:
        for key in ("bias_zero", "ref_bias_zero"):
            stats[f"small_{key}"] = float(np.concatenate(acc.bias[key]).sum()) / counts
        stats["small_bias_min_ulp"] = float(rules["bias_min_ulp"])


def row_spread(acc: Totals, counts: np.ndarray, rules: Mapping[str, Any], stats: dict[str, float],
                reference: str) -> list[str]:
    """Errors shared by a whole row, as a row statistic (a norm's rstd) computed in low precision leaves:
    the spread over rows of the mean error towards zero, against the third run's. Independent roundings
    average out over a row; a wrong per-row factor does not, whatever its sign. Only where the rules ask
    for it (api_specs error_model.yaml `row_statistic`)."""
    factor = float(rules.get("row_spread_factor", 0.0))
    if factor <= 0 or counts.size < int(rules["bias_min_groups"]):
        return []
    spread, ref_spread = (float(np.std(np.concatenate(acc.bias[key]) / counts, ddof=1))
                          for key in ("bias_zero", "ref_bias_zero"))
    stats["row_spread"], stats["ref_row_spread"] = spread, ref_spread
    limit = factor * ref_spread + float(rules["row_spread_min_ulp"])
    if spread <= limit:
        return []
    return [f"row error: the mean error towards zero spreads over rows by {spread:.3g} ULP (limit {limit:.3g} ULP; "
            f"{reference}: {ref_spread:.3g} ULP): errors shared by whole rows, as of a row statistic kept in low "
            f"precision"]


def direction(key: str, mean: float) -> str:
    """The direction of a mean signed error: `bias` is device minus bench (positive: upward), `bias_zero`
    the same times -sign(bench) (positive: towards zero)."""
    if key == "bias":
        return "upward" if mean >= 0 else "downward"
    return "towards zero" if mean >= 0 else "away from zero"
