"""The strict pass's backends: the forms that compute one output's totals (rules.Totals) by the same rules, listed
in one place (BACKENDS), each a module of this package with a `judge_blocks` (the `Backend` interface).

* numpy: block by block in numpy, as the pass was before it was compiled: the reference the others are held to
  (tests/test_strict_kernel.py), never chosen by the plugin;
* numba: numpy arrays on the host, in the compiled kernel (numba_kernel.py), every statistic in one read;
* torch: tensors, in torch ops on the device that holds them (msprobe_checks_on);
* streamed: the numba pass fed its arrays in pieces (streamed.Streamed; check/chunked.py), whole here.

All but torch give the same totals bit for bit; torch adds in its own order (torch_pass.py). Each backend is
imported when first chosen, never at collection (numba and torch load then).
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol, cast

import numpy as np

from .rules import Totals


class Backend(Protocol):
    """One form of the strict pass."""

    def judge_blocks(self, flat: dict[str, Any], row: int, device_dtype: str, rules: Mapping[str, Any],
                     kind: str) -> Totals:
        """The totals of every block of whole rows of the flat arrays `flat` ("b" bench, "d" device, and where
        there are: "t" torch run, "mag" magnitude run, "prod" product, "est" estimated elements); `row`: the
        length of the last dimension."""
        ...


BACKENDS = {"numpy": "numpy_pass", "numba": "numba_pass", "torch": "torch_pass", "streamed": "streamed"}
HOST = "numba"  # the backend of numpy arrays (the tests swap in "numpy" for the reference)
DEVICE = "torch"  # the backend of tensors


def backend(name: str) -> Backend:
    """The backend `name` of BACKENDS (imported on first use)."""
    return cast(Backend, importlib.import_module(f"{__package__}.{BACKENDS[name]}"))


def judge_blocks(flat: dict[str, Any], row: int, device_dtype: str, rules: Mapping[str, Any], kind: str) -> Totals:
    """The totals of the backend of `flat`'s arrays: HOST of numpy arrays, DEVICE of tensors, on the device that
    holds them, or, where that device lacks an op the pass needs, HOST on their copies."""
    if not isinstance(flat["d"], np.ndarray):
        try:
            return backend(DEVICE).judge_blocks(flat, row, device_dtype, rules, kind)
        except RuntimeError as exc:  # an accelerator without an op the pass needs: the host pass judges
            from .torch_pass import unsupported

            unsupported(flat["d"].device, exc)
            flat = {k: host(v) for k, v in flat.items()}
    return backend(HOST).judge_blocks(flat, row, device_dtype, rules, kind)


def host(values: Any) -> np.ndarray:
    """A tensor's values as a numpy array on the host (16-bit floats widened to float32, exactly)."""
    if isinstance(values, np.ndarray):
        return values
    if values.dtype.is_floating_point and values.dtype.itemsize < 4:
        values = values.float()
    return np.asarray(values.detach().cpu().numpy())
