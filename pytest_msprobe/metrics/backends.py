"""The metric pass's backends: the forms that compute one output's statistics (stats.MetricStats) by the same
definitions, listed in one place (BACKENDS), each a module of this package with a `compute` (the `Backend`
interface).

* numpy: whole-array numpy (numpy_pass.py): the reference the others are held to (tests/test_fused_metrics.py),
  never chosen by the plugin;
* numba: numpy arrays on the host, in the compiled pass (fused.py, numba_kernel.py), every statistic in one read;
* torch: tensors, in torch ops on the device that holds them (on_device.py; msprobe_checks_on);
* streamed: the compiled pass fed its bench in pieces (streamed.Streamed; check/chunked.py), whole here.

All but torch give the same maxima, counts and pairwise sums bit for bit (the float64 sums in their own orders);
torch also takes the pairwise sums in its own order (on_device.SUMMED_COLUMNS). Each backend is imported when first
chosen, never at collection (numba and torch load then). vectorised.py computes the columns themselves in numpy (the
oracle of every column, and the path of the pairs no backend supports: fused.supported).
"""
from __future__ import annotations

import importlib
from typing import Any, Protocol, cast

import numpy as np

from .stats import Limits, MetricStats


class Backend(Protocol):
    """One form of the metric pass."""

    def compute(self, b: Any, d: Any, dev_dtype: np.dtype[Any], limits: Limits,
                work: np.dtype[Any]) -> MetricStats | None:
        """The statistics of a bench `b` and a device output `d` of one size (`dev_dtype`: the numpy dtype of d's
        values, `work`: the error dtype B); None where this backend leaves the pair to the host (on_device)."""
        ...


BACKENDS = {"numpy": "numpy_pass", "numba": "fused", "torch": "on_device", "streamed": "streamed"}
HOST = "numba"  # the backend of numpy arrays (the tests swap in "numpy" for the reference)
DEVICE = "torch"  # the backend of tensors (verdict/standards.py's msprobe_checks_on path)


def backend(name: str) -> Backend:
    """The backend `name` of BACKENDS (imported on first use)."""
    return cast(Backend, importlib.import_module(f"{__package__}.{BACKENDS[name]}"))
