"""The error summary of a failing item's outputs for the --msprobe-html page, reduced where the item ran (an
xdist worker): a few hundred numbers per output (a 2-D histogram of the error in ULPs of the device dtype against
the bench's magnitude, the largest error per slice of the flat index, the worst elements), so raw tensors never
leave the worker; the summary rides on the record and html.py draws it on the controller."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable

ULP_LABELS = ["0", "≤½"] + [f"≤{2 ** k}" if k < 10 else f"≤2^{k}" for k in range(0, 21)] + [">2^20"]
MAX_X_BINS = 16
POSITION_BUCKETS = 48
WORST_KEPT = 8


def _r(x: float) -> float:
    return float(f"{x:.6g}") if math.isfinite(x) else x


def gross_limit(specs: dict[str, Any], api_name: str, dtype: str) -> float:
    """strict's gross-error limit for an output of the API (api_specs/thresholds.yaml `strict: gross`, with
    the op kind's and the dtype's overrides), drawn on the plots."""
    from ..specs.loader import error_kind, thresholds_for
    from ..verdict.judge import element_rules

    return float(element_rules(thresholds_for(specs, api_name)["strict"], dtype, error_kind(api_name, specs))["gross"])


def summarize(bench: Sequence[Any], device: Sequence[Any], names: Sequence[Any],
              gross: Callable[[str], float]) -> list[dict[str, Any]]:
    """Bounded summaries of the compared (bench, device) pairs of one item; `gross(dtype)` is strict's limit."""
    import numpy as np
    import torch

    from ..verdict.grid import round_to, supported, ulp

    out = []
    for i, (b, d) in enumerate(zip(bench, device)):
        name = names[i] if i < len(names) and names[i] else f"output.{i}"
        if not (isinstance(b, torch.Tensor) and isinstance(d, torch.Tensor)) or b.shape != d.shape or d.numel() == 0:
            continue
        dtype = str(d.dtype)
        shape = [int(s) for s in d.shape]
        if not d.is_floating_point() or not supported(dtype):
            mismatches = int((b.detach().cpu() != d.detach().cpu()).sum())
            out.append({"name": name, "dtype": dtype, "shape": shape, "numel": d.numel(), "kind": "exact",
                        "mismatches": mismatches})
            continue
        b64 = b.detach().cpu().double().reshape(-1).numpy()
        d64 = d.detach().cpu().double().reshape(-1).numpy()
        with np.errstate(all="ignore"):
            rounded = round_to(b64, dtype)
            nonfinite = (np.isnan(d64) != np.isnan(rounded)) | (np.isinf(d64) != np.isinf(rounded)) | (
                np.isinf(d64) & np.isinf(rounded) & (np.sign(d64) != np.sign(rounded)))
            finite = np.isfinite(d64) & np.isfinite(rounded) & np.isfinite(b64)
            err = np.zeros(d64.size)
            fb, fd, fr = b64[finite], d64[finite], rounded[finite]
            err[finite] = np.where(fd == fr, 0.0, np.abs(fd - fb) / ulp(fr, dtype))
            err[nonfinite] = np.inf
            # y: error in ULPs, bins 0 | <=1/2 | <=1 | <=2 ... <=2^20 | >2^20
            k = np.ceil(np.log2(np.where(err > 0, err, 1.0)))
            ybin = np.where(err > 0, np.clip(k, -1, 21) + 2, 0).astype(np.int64)
            # x: decade of |bench| (bin 0: exactly zero or non-finite)
            mag = np.abs(np.where(np.isfinite(b64), b64, 0.0))
            decade = np.floor(np.log10(np.where(mag > 0, mag, 1.0))).astype(np.int64)
        nonzero = mag > 0
        lo = int(decade[nonzero].min()) if nonzero.any() else 0
        hi = int(decade[nonzero].max()) if nonzero.any() else 0
        step = max(1, math.ceil((hi - lo + 1) / MAX_X_BINS))
        xbin = np.where(nonzero, (decade - lo) // step + 1, 0)
        nx = (hi - lo) // step + 2
        counts = np.zeros((nx, len(ULP_LABELS)), dtype=np.int64)
        np.add.at(counts, (xbin, ybin), 1)
        n = d64.size
        buckets = min(POSITION_BUCKETS, n)
        bucket = np.arange(n) * buckets // n
        pos_max = np.zeros(buckets)
        np.maximum.at(pos_max, bucket, err)
        worst_idx = np.argsort(-err, kind="stable")[:WORST_KEPT]
        worst = [{"index": [int(v) for v in np.unravel_index(int(j), shape)] if shape else [],
                  "bench": _r(float(b64[j])), "device": _r(float(d64[j])), "ulp": _r(float(err[j]))}
                 for j in worst_idx if err[j] > 0]
        finite_err = err[np.isfinite(err)]
        out.append({
            "name": name, "dtype": dtype, "shape": shape, "numel": n, "kind": "float",
            "x_labels": ["0"] + [f"1e{lo + j * step}" for j in range(nx - 1)],
            "y_labels": ULP_LABELS, "counts": counts.tolist(),
            "position_max_ulp": [_r(float(v)) for v in pos_max],
            "worst": worst, "exact": int(np.count_nonzero(err == 0)), "nonfinite_mismatch": int(nonfinite.sum()),
            "max_ulp": _r(float(finite_err.max())) if finite_err.size else 0.0,
            "mean_ulp": _r(float(finite_err.mean())) if finite_err.size else 0.0, "gross": gross(dtype),
        })
    return out
