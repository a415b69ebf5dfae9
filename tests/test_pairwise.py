"""numpy's pairwise sum rebuilt from metrics/pairwise.py's pieces (the tree walk and the vector leaf) equals
numpy's own sum, bit for bit: in the terms' dtype (`leaf` from a start in that dtype, msprobe's metric pass)
and widened to float64 (`leaf` from a float64 start, a float32 sum into float64 as the strict pass takes it)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_msprobe.metrics import pairwise as P

LEAF_START = float(np.add.reduceat(np.array([-0.0, -0.0]), [0])[0])  # numpy 2 starts short leaves at -0.0


def rebuilt(x: np.ndarray, wide: bool) -> float:
    """+0.0 plus the pairwise sum of x from its leaves' sums (numpy's reduce adds its identity first)."""
    n = x.size
    los, lens = np.empty(P.max_leaves(n), np.int64), np.empty(P.max_leaves(n), np.int64)
    stack = np.empty((3, 64), np.int64)
    count = P.leaves(n, los, lens, stack)
    assert count >= 1 and lens[:count].sum() == n and (lens[:count] <= P.PW_BLOCK).all()
    dtype = np.dtype(np.float64) if wide else x.dtype
    start = LEAF_START if wide else x.dtype.type(LEAF_START)
    sums = np.array([P.leaf(x, int(lo), int(k), start) for lo, k in zip(los[:count], lens[:count])], dtype=dtype)
    return float(dtype.type(0.0) + P.combine(n, sums, stack, np.empty(64, dtype)))


def same_bits(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or np.float64(a).tobytes() == np.float64(b).tobytes()


values = st.one_of(st.floats(width=32), st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38]))


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=600), st.sampled_from([np.float32, np.float64]))
def test_the_rebuilt_sum_is_numpys(terms: list[float], dtype: type[np.floating]) -> None:
    x = np.array(terms, dtype=dtype)
    with np.errstate(all="ignore"):
        assert same_bits(rebuilt(x, wide=False), float(x.sum()))
        if dtype == np.float32:  # a float32 sum into float64: numpy widens the terms in its cast buffers
            assert same_bits(rebuilt(x, wide=True), float(x.sum(dtype=np.float64)))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 127, 128, 129, 1000, 8192])
def test_every_leaf_length_and_tree_shape(n: int) -> None:
    """Leaves of every length class (below 8: in order; 8 or more: 8 lanes and a tail) and trees of several
    levels, on values whose sum depends on the order."""
    x = (np.random.default_rng(n).standard_normal(n) * np.exp(np.random.default_rng(n + 1).uniform(-30, 30, n)))
    for dtype in (np.float32, np.float64):
        y = x.astype(dtype)
        assert same_bits(rebuilt(y, wide=False), float(y.sum())), dtype
    y = x.astype(np.float32)
    assert same_bits(rebuilt(y, wide=True), float(y.sum(dtype=np.float64)))
