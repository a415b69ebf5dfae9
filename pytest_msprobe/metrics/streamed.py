"""msprobe's metric pass over a bench that arrives in pieces: the statistics of fused.compute, bit for bit (the
`streamed` backend, backends.py).

The compiled pass (metrics/numba_kernel.py) reads an output in chunks of whole leaves of numpy's pairwise tree and keeps
each chunk's results apart, combining them in the chunks' order at the end. Here each piece of the bench (a block
of the output's elements, in flat order, beside a view of the device output) gets every chunk that lies whole in
it, with the chunks' leaf positions shifted to the piece; the few elements of a chunk that a piece ends inside are
taken again with the next piece (`feed` says how far it got). The combined results are therefore the one pass's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .fused import Pass
from .stats import Limits, MetricStats


class Streamed:
    """The metric pass of an `n`-element output whose device values `d` are whole and whose bench comes in
    pieces (`feed`), in flat order; `finish` gives fused.compute's statistics and the worst element's bench
    value."""

    def __init__(self, d: np.ndarray, dev_dtype: np.dtype[Any], limits: Limits, work: np.dtype[Any]) -> None:
        self.p = Pass(d, dev_dtype, limits, work)
        self.next = 0  # the first chunk not computed yet
        self.bench_at: dict[int, float] = {}  # candidates for the largest error: flat index -> bench value

    @staticmethod
    def plan_bytes(n: int, itemsize: int) -> int:
        """Bytes the pass's plan and its chunks' results hold for an output of n elements (B of `itemsize`): the
        leaves' positions, lengths and three sums, each chunk's maxima, float sums and counts."""
        return n // 128 * (16 + 3 * itemsize) + n // 2048 * (6 * 8 + 13 * 8 * 2)

    def done(self) -> int:
        """The first element of the output not taken yet."""
        p = self.p
        return int(p.los[p.bounds[self.next]]) if self.next < p.count else p.n

    def feed(self, start: int, b: np.ndarray) -> int:
        """Every whole chunk of elements start .. start + len(b) (the bench's values there; `start` no later than
        done()); the first element not taken (the caller passes it again, with what follows)."""
        p = self.p
        end = start + b.size
        k0 = k1 = self.next
        while k1 < p.count:
            last = p.bounds[k1 + 1] - 1
            if p.los[last] + p.lens[last] > end:
                break
            k1 += 1
        if k1 == k0:
            return self.done()
        first, last = p.bounds[k0], p.bounds[k1]
        b = np.ascontiguousarray(b)
        p.los[first:last] -= start  # these chunks' leaves as positions in the piece (no copy of the plan) ...
        try:
            p.chunks(b, p.d[start:end], p.los, k0, k1)
        finally:
            p.los[first:last] += start  # ... and back
        rows = p.ccnt[k0:k1, p.K.I_WORST]
        rows += start  # the candidates' positions back to the output's
        lowest = p.K._LOWEST[0 if p.ints.itemsize == 4 else 1]
        for k in range(k0, k1):
            if p.ckeys[k, p.K.M_AE] != lowest:
                at = int(p.ccnt[k, p.K.I_WORST])
                self.bench_at[at] = float(b[at - start])
        self.next = k1
        return self.done()

    def finish(self) -> tuple[MetricStats, float]:
        """The statistics (every element taken) and the bench's value at the largest error."""
        if self.next != self.p.count:
            raise RuntimeError(f"metric pass finished at chunk {self.next} of {self.p.count}")
        stats = self.p.finish()
        return stats, self.bench_at.get(stats.worst, float("nan"))


def compute(b: np.ndarray, d: np.ndarray, dev_dtype: np.dtype[Any], limits: Limits, work: np.dtype[Any]) -> MetricStats:
    """The statistics of a whole bench fed as one piece (the backend's form of backends.Backend)."""
    s = Streamed(d, dev_dtype, limits, np.dtype(work))
    s.feed(0, np.asarray(b).reshape(-1))
    return s.finish()[0]
