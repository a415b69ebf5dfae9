"""The strict checks' blocked pass in numpy (the numpy backend, verdict/strict/numpy_pass.py): the test oracle.

tests/test_strict_kernel.py feeds this and the numba backend the same arrays and requires the same totals, bit
for bit. The plugin never chooses this backend.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pytest_msprobe.verdict.strict import backends
from pytest_msprobe.verdict.strict.numpy_pass import judge_blocks

__all__ = ["judge_blocks", "numpy_strict"]


@contextmanager
def numpy_strict() -> Iterator[None]:
    """strict.strict_compare runs this oracle instead of the kernel while the block runs."""
    kernel = backends.HOST
    backends.HOST = "numpy"
    try:
        yield
    finally:
        backends.HOST = kernel
