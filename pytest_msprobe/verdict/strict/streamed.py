"""The strict pass's streamed backend: a bench, third run and magnitude run that arrive in pieces, strict_compare's
verdict and statistics, bit for bit, without any of them whole.

strict_compare cuts an output into blocks of whole rows and judges each block on its own (numba_kernel's
strict_blocks), each into its own row of results, then adds the blocks' results in order. So each piece gets the
whole blocks that lie in it, as arrays that start at the piece's first element (the kernel's `origin`): the
results, the bias test's sampling of every `every`-th block and its groups are the whole pass's. A reduction's or contraction's scale floor
needs the bench's sum of squares first: numpy's einsum adds it in buffers of 8,192 elements, which `Squares` adds
in the same order from the pieces (the caller runs the bench once more for it).

An output whose totals are not finite (inf/NaN elements) takes strict_compare's careful path, which reads the
arrays whole: `finish` returns None there, and the caller says it cannot be judged in pieces.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ...metrics.storage import widen
from .. import grid
from . import numba_pass
from .rules import ROW_KINDS, Judged, StrictResult, Totals, floor_of, judged, sizes
from .rules import params as rules_params

EINSUM_BUFFER = 8192  # numpy's buffer: einsum's float64 sum of float32 squares adds buffer by buffer


class Squares:
    """The bench's float64 sum of squares as np.einsum("i,i->", b, b, dtype=float64) adds it over the whole,
    from pieces in flat order."""

    def __init__(self) -> None:
        self.total = 0.0
        self.tail: np.ndarray | None = None

    def feed(self, b: np.ndarray) -> None:
        b = np.concatenate((self.tail, b)) if self.tail is not None and self.tail.size else b
        whole = b.size // EINSUM_BUFFER * EINSUM_BUFFER
        for i in range(0, whole, EINSUM_BUFFER):
            part = b[i:i + EINSUM_BUFFER]
            self.total = float(np.einsum("i,i->", part, part, dtype=np.float64)) + self.total
        self.tail = b[whole:].copy()

    def finish(self) -> float:
        if self.tail is not None and self.tail.size:
            self.total = float(np.einsum("i,i->", self.tail, self.tail, dtype=np.float64)) + self.total
            self.tail = None
        return self.total


class Cut(NamedTuple):
    """How the strict pass cuts an output into blocks: the op's kind (elementwise, reduction, contraction:
    rules.ROW_KINDS judge whole rows) and the length of its last dimension (a block is whole rows)."""
    kind: str
    row: int


class Streamed:
    """strict_compare of an output whose device values `d` (flat, as the checks read them) are whole and whose
    bench ("b"), torch run ("t"), magnitude run ("mag") and product ("prod") come in pieces (`feed`)."""

    def __init__(self, d: np.ndarray, device_dtype: str, rules: Mapping[str, Any], cut: Cut, floor: float,
                 has_t: bool) -> None:
        from . import numba_kernel as K  # numba: imported and loaded on the first check, not at collection

        kind, row = cut

        self.K, self.d, self.device_dtype, self.rules, self.kind, self.has_t = K, d, device_dtype, rules, kind, has_t
        self.m = m = int(d.size)
        self.size, self.block, self.every = sizes(m, row, rules)
        self.work = grid.work_dtype(device_dtype)
        self.params = rules_params(floor, rules, device_dtype, K.LEAF_START)
        self.blocks = -(-m // self.block)
        self.per_block = -(-self.block // self.size)
        groups = (-(-self.blocks // self.every)) * self.per_block
        self.bias, self.counts = np.empty((4, groups)), np.empty(groups, dtype=np.int64)
        self.rows = np.empty((self.blocks, K.R_MAX_T + 1))
        self.irows = np.empty((self.blocks, K.I_GROUPS + 1), dtype=np.int64)
        self.ints = np.empty(0, dtype=np.int32 if self.work == np.float32 else np.int64)
        self.scratch = numba_pass.scratch(self.work, min(self.block, m))
        self.next = 0  # the first block not judged yet
        self.bench_at: dict[int, float] = {}  # flat index -> bench value, of each block's worst and first wrong

    def done(self) -> int:
        """The first element not judged yet."""
        return min(self.next * self.block, self.m)

    def feed(self, start: int, pieces: Mapping[str, np.ndarray]) -> int:
        """Every whole block (or the output's last one) in elements start .. start + the pieces' length (`start` ==
        done()); the first element not judged."""
        K = self.K
        end = start + pieces["b"].size
        k0 = self.next
        stop = self.m if end >= self.m else start + (end - start) // self.block * self.block
        if stop <= start:
            return self.done()
        k1 = -(-stop // self.block)
        n = stop - start
        flat = {key: value[:n] for key, value in pieces.items()}
        flat["d"] = self.d[start:stop]
        arrays = numba_pass.kernel_arrays(flat, self.work)
        K.strict_blocks(*arrays, *self.scratch, self.ints, K.FORMATS[self.device_dtype], K.KINDS[self.kind],
                        self.size, self.block, self.every, self.params, k0, k1, start, self.bias, self.counts,
                        self.rows, self.irows)
        irows = self.irows[k0:k1]
        wrong = irows[:, K.I_FIRST_WRONG]
        b = arrays[0]
        for at in (*irows[:, K.I_WORST], *wrong[wrong >= 0]):
            self.bench_at[int(at)] = float(b[int(at) - start])
        self.next = k1
        return self.done()

    def finish(self) -> StrictResult | None:
        """The verdict (None where the totals are not finite: strict_compare's careful path reads whole arrays)."""
        if self.next != self.blocks:
            raise RuntimeError(f"strict pass finished at block {self.next} of {self.blocks}")
        if not self.m:
            return StrictResult("pass", "empty output", {"nonfinite_mismatch": 0.0})
        acc = self.totals()
        if not (np.isfinite(acc.sum_w) and np.isfinite(acc.sum_t)):
            return None
        stats: dict[str, float] = {"nonfinite_mismatch": 0.0}

        def value_at(key: str, i: int) -> float:
            return float(widen(self.d[i:i + 1])[0]) if key == "d" else self.bench_at[i]

        with np.errstate(all="ignore"):
            return judged(acc, self.rules, stats, Judged(self.m, self.has_t, self.device_dtype, acc.worst, value_at))

    def totals(self) -> Totals:
        """The totals of every block, once all are judged."""
        return numba_pass.finished(self.rows, self.irows, self.has_t, self.bias, self.counts)


def floor(squares: float, m: int, bench_itemsize: int, rules: Mapping[str, Any], kind: str) -> float:
    """rules.plan's scale floor of a bench whose sum of squares is `squares` (0 outside reductions and
    contractions)."""
    return floor_of(squares, m, bench_itemsize, rules) if kind in ROW_KINDS else 0.0


def judge_blocks(flat: dict[str, Any], row: int, device_dtype: str, rules: Mapping[str, Any], kind: str) -> Totals:
    """The Backend interface: the totals of whole numpy arrays, fed as one piece (the bench's squares first)."""
    squares = Squares()
    squares.feed(flat["b"])
    m = int(flat["d"].size)
    blocks = Streamed(flat["d"], device_dtype, rules, Cut(kind, row),
                      floor(squares.finish(), m, flat["b"].dtype.itemsize, rules, kind), "t" in flat)
    blocks.feed(0, {k: v for k, v in flat.items() if k != "d"})
    return blocks.totals()
