"""strict_compare: one output's verdict by the strict standard (rules.py), its totals from the backend of its
arrays (backends.py); non-finite elements are matched here, on the host, before the finite ones are judged."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...metrics.storage import widen
from ..grid import round_to
from . import backends
from .rules import Judged, StrictResult, judged, size_of


@dataclass(frozen=True)
class Runs:
    """What an output is judged with beside bench and device (strict_compare): the op's kind, the torch run, the
    magnitude run, a contraction's product before its bias, the length of the last dimension, the elements whose
    torch-run value is estimated."""
    kind: str = "elementwise"
    torch_run: Any = None
    magnitude: Any = None
    product: Any = None
    row: int = 1
    estimated: Any = None


NO_RUNS = Runs()


def strict_compare(bench: np.ndarray, device: np.ndarray, device_dtype: str, rules: Mapping[str, Any],
                   runs: Runs = NO_RUNS) -> StrictResult:
    """Judge one float output (all arrays of one shape, any float dtype; `device` and `torch_run` hold
    values of the device dtype; `runs`: what else it is judged with). `row` is the length of the last dimension. `product` is a contraction's
    result before its bias was added, whose own rounding a sound kernel may keep. `estimated` marks the
    elements whose torch-run value is estimated from a sampled row (third_run.sampled_torch_run): they
    are judged against the RMS of the row's torch errors, not the element's own.

    Without a torch run the ideal kernel (the bench correctly rounded) stands in for it. The work runs
    in blocks of whole rows, so its temporaries stay in cache, in the backend of the arrays (backends.py).
    """
    kind, row, torch_run = runs.kind, runs.row, runs.torch_run
    arrays = {"b": bench, "d": device, "t": torch_run, "mag": runs.magnitude, "prod": runs.product,
              "est": runs.estimated if torch_run is not None else None}
    flat = {k: flat_view(v) for k, v in arrays.items() if v is not None}
    flat["b"] = widen(flat["b"])  # a bf16 bench (rare) as its values; the outputs' storage is read as it is
    n = size_of(flat["d"])
    stats: dict[str, float] = {"nonfinite_mismatch": 0.0}
    if not n:
        return StrictResult("pass", "empty output", stats)
    with np.errstate(all="ignore"):
        finite = None
        acc = backends.judge_blocks(flat, row, device_dtype, rules, kind)
        # the totals are finite when every element is (a huge finite one only sends the output down this
        # careful path too): then drop the non-finite positions, which must match the bench's
        if not (np.isfinite(acc.sum_w) and np.isfinite(acc.sum_t)):
            flat = {k: backends.host(v) for k, v in flat.items()}  # rare: tensors on a device come back for this
            b = flat["b"].astype(np.float64)
            d = widen(flat["d"]).astype(np.float64)
            rounded = round_to(b, device_dtype)
            t = rounded if "t" not in flat else widen(flat["t"]).astype(np.float64)
            finite = np.isfinite(d) & np.isfinite(rounded) & np.isfinite(t) & np.isfinite(b)
            bad_dev, bad_ref = nonfinite_mismatch(d, rounded), nonfinite_mismatch(t, rounded)
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
                acc = backends.judge_blocks(flat, 1, device_dtype, rules, kind)  # rows lose their meaning here
    index = acc.worst if finite is None else int(np.flatnonzero(finite)[acc.worst])
    return judged(acc, rules, stats, Judged(size_of(flat["d"]), "t" in flat, device_dtype, index,
                                            lambda key, i: value_at(flat[key], i)))


def nonfinite_mismatch(values: np.ndarray, rounded: np.ndarray) -> np.ndarray:
    nan_v, nan_b = np.isnan(values), np.isnan(rounded)
    inf_v, inf_b = np.isinf(values), np.isinf(rounded)
    mismatch: np.ndarray = (nan_v != nan_b) | (inf_v != inf_b) | (inf_v & inf_b & (np.sign(values) != np.sign(rounded)))
    return mismatch


def value_at(values: Any, i: int) -> float:
    """The value of element i of a flat numpy array (bf16 storage widened) or tensor."""
    return float(widen(values[i:i + 1])[0])


def flat_view(values: Any) -> Any:
    """A flat view of a numpy array (or anything numpy takes) or of a torch tensor, which stays where it is."""
    return np.asarray(values).reshape(-1) if isinstance(values, (np.ndarray, np.generic, float, int, list)) \
        else values.reshape(-1)
