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
   the mean error towards zero does not spread over rows much more than the torch run's.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..helper import share
from ..metrics.storage import BITS, kernel_view, widen
from .grid import FORMATS, accumulation_roundoff, round_to, ulp, work_dtype

KINDS = ("elementwise", "exact", "reduction", "contraction")


@dataclass
class StrictResult:
    status: str  # "pass" | "error"
    message: str
    stats: dict[str, float]


def _nonfinite_mismatch(values: np.ndarray, rounded: np.ndarray) -> np.ndarray:
    nan_v, nan_b = np.isnan(values), np.isnan(rounded)
    inf_v, inf_b = np.isinf(values), np.isinf(rounded)
    mismatch: np.ndarray = (nan_v != nan_b) | (inf_v != inf_b) | (inf_v & inf_b & (np.sign(values) != np.sign(rounded)))
    return mismatch


def _groups(n: int, row: int, min_size: int) -> int:
    """Elements per group: whole rows (the last dimension), merged until a group has min_size elements."""
    row = max(1, min(row, n))
    size = row * -(-min_size // row) if row < min_size else row
    return min(size, n)


def _t_statistic(sums: np.ndarray, counts: np.ndarray, min_groups: int) -> tuple[float, float]:
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


class _Totals:
    """What the blocked pass accumulates: sums and maxima of the normalised errors, the first gross and
    wrongly rounded elements, and per-group sums of the signed errors for the bias test."""

    def __init__(self) -> None:
        self.sum_w = self.sum_t = self.max_t = 0.0
        self.max_w, self.worst, self.gross, self.wrong, self.first_wrong = -1.0, 0, 0, 0, -1
        self.wrong_zero = self.wrong_up = 0  # wrongly rounded elements below the correct |value|, above it
        self.wrong_off_tie = 0  # wrongly rounded elements whose exact value is not near a rounding tie
        self.bias: dict[str, list[np.ndarray]] = {k: [] for k in ("bias", "ref_bias", "bias_zero", "ref_bias_zero")}
        self.counts: list[np.ndarray] = []


BLOCK = 1 << 15  # elements per block: a dozen temporaries of a block stay in cache
GRAIN = 1 << 17  # elements of whole blocks that either thread takes at a time: ~0.25 ms of work, ~10 us to call


def strict_compare(bench: np.ndarray, device: np.ndarray, device_dtype: str, rules: Mapping[str, Any], *,
                   kind: str = "elementwise", torch_run: np.ndarray | None = None,
                   magnitude: np.ndarray | None = None, product: np.ndarray | None = None,
                   row: int = 1, estimated: np.ndarray | None = None) -> StrictResult:
    """Judge one float output (all arrays of one shape, any float dtype; `device` and `torch_run` hold
    values of the device dtype). `row` is the length of the last dimension. `product` is a contraction's
    result before its bias was added, whose own rounding a sound kernel may keep. `estimated` marks the
    elements whose torch-run value is estimated from a sampled row (third_run.sampled_torch_run): they
    are judged against the RMS of the row's torch errors, not the element's own.

    Without a torch run the ideal kernel (the bench correctly rounded) stands in for it. The work runs
    in blocks of whole rows, so its temporaries stay in cache.
    """
    arrays = {"b": bench, "d": device, "t": torch_run, "mag": magnitude, "prod": product,
              "est": estimated if torch_run is not None else None}
    flat = {k: _flat(v) for k, v in arrays.items() if v is not None}
    flat["b"] = widen(flat["b"])  # a bf16 bench (rare) as its values; the outputs' storage is read as it is
    n = size_of(flat["d"])
    stats: dict[str, float] = {"nonfinite_mismatch": 0.0}
    if not n:
        return StrictResult("pass", "empty output", stats)
    with np.errstate(all="ignore"):
        finite = None
        acc = _judge_blocks(flat, row, device_dtype, rules, kind)
        # the totals are finite when every element is (a huge finite one only sends the output down this
        # careful path too): then drop the non-finite positions, which must match the bench's
        if not (np.isfinite(acc.sum_w) and np.isfinite(acc.sum_t)):
            flat = {k: _host(v) for k, v in flat.items()}  # rare: tensors on a device come back for this
            b = flat["b"].astype(np.float64)
            d = widen(flat["d"]).astype(np.float64)
            rounded = round_to(b, device_dtype)
            t = rounded if "t" not in flat else widen(flat["t"]).astype(np.float64)
            finite = np.isfinite(d) & np.isfinite(rounded) & np.isfinite(t) & np.isfinite(b)
            bad_dev, bad_ref = _nonfinite_mismatch(d, rounded), _nonfinite_mismatch(t, rounded)
            # a position where torch's own kernel shows the very same non-finite value is inherent
            mismatch = bad_dev & ~(bad_ref & ((d == t) | (np.isnan(d) & np.isnan(t))))
            if mismatch.any():
                first = int(np.flatnonzero(mismatch)[0])
                stats["nonfinite_mismatch"] = float(np.count_nonzero(mismatch))
                return StrictResult("error", f"NaN/inf mismatch at {int(stats['nonfinite_mismatch'])} of {n} elements "
                                             f"(first at flat index {first}: device {float(d[first])!r}, "
                                             f"bench {float(rounded[first])!r})", stats)
            if not finite.all():  # else the elements are finite and only a total overflowed
                flat = {k: v[finite] for k, v in flat.items()}
                if not flat["d"].size:
                    return StrictResult("pass", "no finite elements; non-finite positions match", stats)
                acc = _judge_blocks(flat, 1, device_dtype, rules, kind)  # rows lose their meaning here
    index = acc.worst if finite is None else int(np.flatnonzero(finite)[acc.worst])
    return judged(acc, size_of(flat["d"]), rules, stats, "t" in flat, device_dtype, index,
                  lambda key, i: _at(flat[key], i))


def judged(acc: _Totals, m: int, rules: Mapping[str, Any], stats: dict[str, float], has_t: bool, device_dtype: str,
           index: int, value_at: Any) -> StrictResult:
    """The verdict from a pass's totals over m elements; `index`: the worst element's flat index in the output;
    `value_at(key, i)`: element i of the judged arrays' "d" (device) or "b" (bench) as a float."""
    reference = "torch run" if has_t else "correctly rounded"  # what the device is held against
    stats.update(max_err=acc.max_w, mean_err=acc.sum_w / m, ref_max_err=acc.max_t, ref_mean_err=acc.sum_t / m)
    problems = []
    # A few wrongly rounded elements may be a sound kernel's other rounding of a scalar operand: at a tie
    # (the exact value within the scalar's fp32 rounding of a midpoint). Many, ones off a tie, or ones that
    # all lean one way (truncation: toward zero; a sign test over them) are not.
    lean = max(abs(2 * k - acc.wrong) for k in (acc.wrong_zero, acc.wrong_up)) / np.sqrt(max(acc.wrong, 1))
    stats["wrong_lean_z"], stats["wrong_off_tie"] = float(lean), float(acc.wrong_off_tie)
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
        problems += _bias(acc, rules, stats, reference)
    if problems:
        return StrictResult("error", "; ".join(problems), stats)
    return StrictResult("pass", "", stats)


def plan(flat: Mapping[str, Any], row: int, rules: Mapping[str, Any], kind: str) -> tuple[int, int, int, float]:
    """(elements per group, per block, every how many blocks the bias test samples, scale floor); numpy
    arrays or torch tensors."""
    m = size_of(flat["d"])
    floor = 0.0
    if kind in ("reduction", "contraction"):  # below the bench's own resolution nothing is judged
        if isinstance(flat["b"], np.ndarray):
            squares = float(np.einsum("i,i->", flat["b"], flat["b"], dtype=np.float64))
        else:
            from .strict_torch import sum_of_squares
            squares = sum_of_squares(flat["b"])
        floor = floor_of(squares, m, flat["b"].dtype.itemsize, rules)
    return (*sizes(m, row, rules), floor)


def floor_of(squares: float, m: int, bench_itemsize: int, rules: Mapping[str, Any]) -> float:
    """A reduction's or contraction's scale floor: the bench's own resolution at its root mean square, from the sum
    of its m squares (`squares`, float64)."""
    bench_roundoff = 2.0 ** -24 if bench_itemsize <= 4 else 2.0 ** -53
    return float(rules["bench_factor"] * bench_roundoff * float(np.sqrt(squares / m)))


def sizes(m: int, row: int, rules: Mapping[str, Any]) -> tuple[int, int, int]:
    """plan's (elements per group, per block, every how many blocks the bias test samples) of m elements."""
    # groups of whole rows; a small output is cut into bias_min_groups blocks so the bias test can run
    size = min(_groups(m, row, int(rules["row_min"])), max(1, m // int(rules["bias_min_groups"])))
    block = size * max(1, BLOCK // size)
    # the bias test samples every `every`-th block: about bias_max_samples elements, and at least
    # bias_min_groups blocks (each holds one group or more)
    blocks = -(-m // block)
    every = max(1, min(m // int(rules["bias_max_samples"]), blocks // int(rules["bias_min_groups"])))
    return size, block, every


def kernel_params(floor: float, rules: Mapping[str, Any], device_dtype: str, leaf_start: float) -> np.ndarray:
    """The pass's float parameters, in strict_kernel's P_* order (the torch pass reads the same)."""
    mantissa, emin = FORMATS[device_dtype]
    factor = {k: float(rules.get(k, 0.0)) for k in ("torch_factor", "row_factor", "estimated_row_factor",
                                                    "accumulation_factor", "exact_tie_factor")}
    return np.array([floor, factor["torch_factor"], factor["row_factor"], factor["estimated_row_factor"],
                     factor["accumulation_factor"] * accumulation_roundoff(device_dtype), rules["gross"],
                     2.0 ** emin, 2.0 ** -mantissa, factor["exact_tie_factor"] * 2.0 ** (mantissa - 24),
                     leaf_start])


def _judge_blocks(flat: dict[str, Any], row: int, device_dtype: str, rules: Mapping[str, Any],
                  kind: str) -> _Totals:
    """The totals of every block of whole rows: from the compiled pass (strict_kernel) on numpy arrays (in the
    helper thread, in grains of blocks that a thread waiting for it takes too: helper.share), from the torch pass
    (strict_torch) on tensors, on the device that holds them."""
    work = work_dtype(device_dtype)
    if not isinstance(flat["d"], np.ndarray):
        from . import strict_torch

        try:
            size, block, every, floor = plan(flat, row, rules, kind)
            got, sums, sizes = strict_torch.strict_pass(flat, device_dtype, kind, size, block, every,
                                                        kernel_params(floor, rules, device_dtype, 0.0), work)
            return _totals_of(got, sums, sizes)
        except RuntimeError as exc:  # an accelerator without an op the pass needs: the host pass judges
            strict_torch.unsupported(flat["d"].device, exc)
            return _judge_blocks({k: _host(v) for k, v in flat.items()}, row, device_dtype, rules, kind)
    size, block, every, floor = plan(flat, row, rules, kind)
    from . import strict_kernel as K  # numba: imported and loaded on the first check, not at collection

    params = kernel_params(floor, rules, device_dtype, K.LEAF_START)
    m = flat["d"].size
    blocks = -(-m // block)
    groups = (-(-blocks // every)) * -(-block // size)
    bias, counts = np.empty((4, groups)), np.empty(groups, dtype=np.int64)
    rows, irows = np.empty((blocks, K.R_MAX_T + 1)), np.empty((blocks, K.I_GROUPS + 1), dtype=np.int64)
    arrays = kernel_arrays(flat, work)
    ints = np.empty(0, dtype=np.int32 if work == np.float32 else np.int64)

    buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # each thread's, made once per pass

    def blocks_of(b0: int, b1: int) -> None:
        mine = buffers.get(threading.get_ident()) or buffers.setdefault(threading.get_ident(),
                                                                         _scratch(work, min(block, m)))
        K.strict_blocks(*arrays, *mine, ints, K.FORMATS[device_dtype], K.KINDS[kind], size, block, every, params,
                        b0, b1, 0, bias, counts, rows, irows)

    share(blocks, max(1, GRAIN // block), blocks_of)
    return finished(rows, irows, "t" in flat, bias, counts)


def finished(rows: np.ndarray, irows: np.ndarray, has_t: bool, bias: np.ndarray, counts: np.ndarray) -> _Totals:
    """The totals of every block's results (strict_blocks'), added in the blocks' order (strict_finish)."""
    from . import strict_kernel as K
    out = np.empty(K.O_GROUPS + 1)
    K.strict_finish(rows, irows, has_t, out)
    n = int(out[K.O_GROUPS])
    slots = {"sum_w": K.O_SUM_W, "sum_t": K.O_SUM_T, "max_t": K.O_MAX_T, "max_w": K.O_MAX_W, "worst": K.O_WORST,
             "gross": K.O_GROSS, "wrong": K.O_WRONG, "first_wrong": K.O_FIRST_WRONG, "wrong_zero": K.O_WRONG_ZERO,
             "wrong_up": K.O_WRONG_UP, "off_tie": K.O_OFF_TIE}
    return _totals_of({k: float(out[slot]) for k, slot in slots.items()}, bias[:, :n], counts[:n])


Arrays6 = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def kernel_arrays(flat: Mapping[str, np.ndarray], work: type[np.floating[Any]]) -> Arrays6:
    """strict_blocks' arrays (b, d, t, mag, prod, est) of numpy arrays `flat` (absent ones empty)."""
    side = _side_dtype(flat, work)
    extra = np.dtype(np.float32) if side.itemsize == 2 else side  # the magnitude run and the product
    # the bench as it is where it is float32 or float64 (the pass rounds it to the work dtype a chunk at a time,
    # as numpy did a block at a time): no copy of a float64 bench of a 16-bit output before the call
    bench_dtype = flat["b"].dtype if flat["b"].dtype in (np.float32, np.float64) else np.dtype(work)
    return (_kernel_array(flat["b"], bench_dtype), kernel_view(_kernel_array(flat["d"], side)),
            kernel_view(_kernel_array(flat.get("t"), side)), _kernel_array(flat.get("mag"), extra),
            _kernel_array(flat.get("prod"), extra),
            np.ascontiguousarray(flat["est"]) if "est" in flat else np.empty(0, dtype=np.bool_))


def _totals_of(got: Mapping[str, float], sums: np.ndarray, counts: np.ndarray) -> _Totals:
    """A pass's totals (by name) and the bias test's group sums and sizes as a _Totals."""
    acc = _Totals()
    acc.sum_w, acc.sum_t, acc.max_t, acc.max_w = got["sum_w"], got["sum_t"], got["max_t"], got["max_w"]
    acc.worst, acc.gross, acc.wrong, acc.first_wrong, acc.wrong_zero, acc.wrong_up, acc.wrong_off_tie = (
        int(got[k]) for k in ("worst", "gross", "wrong", "first_wrong", "wrong_zero", "wrong_up", "off_tie"))
    acc.bias = {k: [sums[i]] for i, k in enumerate(("bias", "ref_bias", "bias_zero", "ref_bias_zero"))}
    acc.counts = [counts]
    return acc


_THREAD = threading.local()


def _scratch(work: type[np.floating[Any]], size: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's block buffers (work dtype, float64), kept per thread up to BLOCK elements: fresh ones on
    every call would cost page faults and most of the time of a small output. A longer block (rows longer
    than BLOCK) gets its own, freed after the call, so no large buffer stays in the process."""
    from .strict_kernel import SCRATCH, WIDE

    if size > BLOCK:
        return np.empty((SCRATCH, size), dtype=work), np.empty((WIDE, size))
    key = np.dtype(work).char
    have = getattr(_THREAD, key, None)
    if have is None:
        have = (np.empty((SCRATCH, BLOCK), dtype=work), np.empty((WIDE, BLOCK)))
        setattr(_THREAD, key, have)
    return have


def _side_dtype(flat: Mapping[str, np.ndarray], work: type[np.floating[Any]]) -> np.dtype[Any]:
    """One dtype for device, torch run, magnitude and product, so that few signatures are compiled (five:
    bf16 outputs, fp16 ones, other 16-bit ones, fp32 outputs, fp64 ones): a 16-bit output's storage where device
    and torch run are both bf16 storage or both fp16 (the pass widens each element in registers: no copy;
    metrics/storage.py), else the work dtype of 16-bit outputs (numpy rounds each to it), else float32 when all
    are float32 (fp32 outputs)."""
    for stored in (BITS, np.dtype(np.float16)):
        if all(flat[k].dtype == stored for k in ("d", "t") if k in flat):
            return stored  # the magnitude run (fp32) and the product are then read as float32
    sides = [flat[k].dtype for k in ("d", "t", "mag", "prod") if k in flat]
    if work == np.float32 or all(dtype == np.float32 for dtype in sides):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _kernel_array(values: np.ndarray | None, dtype: type[np.floating[Any]] | np.dtype[Any]) -> np.ndarray:
    """`values` as a contiguous array of `dtype` (no copy where it is one; bf16 storage widened to its values
    where `dtype` is not that storage); an empty one where there is none."""
    if values is None:
        return np.empty(0, dtype=dtype)
    return np.ascontiguousarray(values if np.dtype(dtype) == values.dtype else widen(values), dtype=dtype)


def _at(values: Any, i: int) -> float:
    """The value of element i of a flat numpy array (bf16 storage widened) or tensor."""
    return float(widen(values[i:i + 1])[0])


def _flat(values: Any) -> Any:
    """A flat view of a numpy array (or anything numpy takes) or of a torch tensor, which stays where it is."""
    return np.asarray(values).reshape(-1) if isinstance(values, (np.ndarray, np.generic, float, int, list)) \
        else values.reshape(-1)


def size_of(values: Any) -> int:
    """Elements of a numpy array or of a torch tensor."""
    return int(values.size) if isinstance(values, np.ndarray) else int(values.numel())


def _host(values: Any) -> np.ndarray:
    """A tensor's values as a numpy array on the host (16-bit floats widened to float32, exactly)."""
    if isinstance(values, np.ndarray):
        return values
    if values.dtype.is_floating_point and values.dtype.itemsize < 4:
        values = values.float()
    return np.asarray(values.detach().cpu().numpy())


def _bias(acc: _Totals, rules: Mapping[str, Any], stats: dict[str, float], reference: str) -> list[str]:
    """Systematic shifts, in one direction or towards zero: significant over rows and larger than the
    torch run's own (`reference` names it in the message)."""
    problems = []
    counts = np.concatenate(acc.counts)
    min_groups = int(rules["bias_min_groups"])
    for key in ("bias", "bias_zero"):
        mean, t_dev = _t_statistic(np.concatenate(acc.bias[key]), counts, min_groups)
        ref_mean, t_ref = _t_statistic(np.concatenate(acc.bias[f"ref_{key}"]), counts, min_groups)
        stats[key], stats[f"{key}_t"], stats[f"ref_{key}"], stats[f"ref_{key}_t"] = mean, t_dev, ref_mean, t_ref
        t_limit = max(float(rules["bias_t"]), rules["bias_ref_factor"] * abs(t_ref))
        size_limit = rules["bias_min_ulp"] + abs(ref_mean)
        if abs(t_dev) > t_limit and abs(mean) > size_limit:
            problems.append(f"bias: errors biased {_direction(key, mean)}: {abs(mean):.3g} ULP on average, each "
                            f"error clipped to ±1 ULP (limit {size_limit:.3g} ULP; {reference}: {abs(ref_mean):.3g} ULP "
                            f"{_direction(key, ref_mean)}), t-statistic {abs(t_dev):.3g} > {t_limit:.3g}")
    problems += _row_spread(acc, counts, rules, stats, reference)
    return problems


def _row_spread(acc: _Totals, counts: np.ndarray, rules: Mapping[str, Any], stats: dict[str, float],
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


def _direction(key: str, mean: float) -> str:
    """The direction of a mean signed error: `bias` is device minus bench (positive: upward), `bias_zero`
    the same times -sign(bench) (positive: towards zero)."""
    if key == "bias":
        return "upward" if mean >= 0 else "downward"
    return "towards zero" if mean >= 0 else "away from zero"
