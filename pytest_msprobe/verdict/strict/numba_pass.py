"""The strict pass's numba backend: numpy arrays on the host, judged by the compiled kernel (numba_kernel.py) in blocks
that the helper thread and a thread waiting for it share; the arrays reach the kernel as they are stored (no copy of
a 16-bit output's storage, nor of a float32 or float64 bench)."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...helper import share
from ...metrics.storage import BITS, kernel_view, widen
from ..grid import work_dtype
from .rules import BLOCK, Totals, plan, totals_of
from .rules import params as rules_params

GRAIN = 1 << 17  # elements of whole blocks that either thread takes at a time: ~0.25 ms of work, ~10 us to call


def judge_blocks(flat: dict[str, Any], row: int, device_dtype: str, rules: Mapping[str, Any], kind: str) -> Totals:
    """The totals of every block of whole rows of numpy arrays, from the compiled pass (numba_kernel), in the
    helper thread, in grains of blocks that a thread waiting for it takes too (helper.share)."""
    work = work_dtype(device_dtype)
    size, block, every, floor = plan(flat, row, rules, kind)
    from . import numba_kernel as K  # numba: imported and loaded on the first check, not at collection

    params = rules_params(floor, rules, device_dtype, K.LEAF_START)
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
                                                                         scratch(work, min(block, m)))
        K.strict_blocks(*arrays, *mine, ints, K.FORMATS[device_dtype], K.KINDS[kind], size, block, every, params,
                        b0, b1, 0, bias, counts, rows, irows)

    share(blocks, max(1, GRAIN // block), blocks_of)
    return finished(rows, irows, "t" in flat, bias, counts)


def finished(rows: np.ndarray, irows: np.ndarray, has_t: bool, bias: np.ndarray, counts: np.ndarray) -> Totals:
    """The totals of every block's results (strict_blocks'), added in the blocks' order (strict_finish)."""
    from . import numba_kernel as K
    out = np.empty(K.O_GROUPS + 1)
    K.strict_finish(rows, irows, has_t, out)
    n = int(out[K.O_GROUPS])
    slots = {"sum_w": K.O_SUM_W, "sum_t": K.O_SUM_T, "max_t": K.O_MAX_T, "max_w": K.O_MAX_W, "worst": K.O_WORST,
             "gross": K.O_GROSS, "wrong": K.O_WRONG, "first_wrong": K.O_FIRST_WRONG, "wrong_zero": K.O_WRONG_ZERO,
             "wrong_up": K.O_WRONG_UP, "off_tie": K.O_OFF_TIE}
    return totals_of({k: float(out[slot]) for k, slot in slots.items()}, bias[:, :n], counts[:n])


Arrays6 = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def kernel_arrays(flat: Mapping[str, np.ndarray], work: type[np.floating[Any]]) -> Arrays6:
    """strict_blocks' arrays (b, d, t, mag, prod, est) of numpy arrays `flat` (absent ones empty)."""
    side = side_dtype(flat, work)
    extra = np.dtype(np.float32) if side.itemsize == 2 else side  # the magnitude run and the product
    # the bench as it is where it is float32 or float64 (the pass rounds it to the work dtype a chunk at a time,
    # as numpy did a block at a time): no copy of a float64 bench of a 16-bit output before the call
    bench_dtype = flat["b"].dtype if flat["b"].dtype in (np.float32, np.float64) else np.dtype(work)
    return (kernel_array(flat["b"], bench_dtype), kernel_view(kernel_array(flat["d"], side)),
            kernel_view(kernel_array(flat.get("t"), side)), kernel_array(flat.get("mag"), extra),
            kernel_array(flat.get("prod"), extra),
            np.ascontiguousarray(flat["est"]) if "est" in flat else np.empty(0, dtype=np.bool_))


_THREAD = threading.local()


def scratch(work: type[np.floating[Any]], size: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's block buffers (work dtype, float64), kept per thread up to BLOCK elements: fresh ones on
    every call would cost page faults and most of the time of a small output. A longer block (rows longer
    than BLOCK) gets its own, freed after the call, so no large buffer stays in the process."""
    from .numba_kernel import SCRATCH, WIDE

    if size > BLOCK:
        return np.empty((SCRATCH, size), dtype=work), np.empty((WIDE, size))
    key = np.dtype(work).char
    have = getattr(_THREAD, key, None)
    if have is None:
        have = (np.empty((SCRATCH, BLOCK), dtype=work), np.empty((WIDE, BLOCK)))
        setattr(_THREAD, key, have)
    return have


def side_dtype(flat: Mapping[str, np.ndarray], work: type[np.floating[Any]]) -> np.dtype[Any]:
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


def kernel_array(values: np.ndarray | None, dtype: type[np.floating[Any]] | np.dtype[Any]) -> np.ndarray:
    """`values` as a contiguous array of `dtype` (no copy where it is one; bf16 storage widened to its values
    where `dtype` is not that storage); an empty one where there is none."""
    if values is None:
        return np.empty(0, dtype=dtype)
    return np.ascontiguousarray(values if np.dtype(dtype) == values.dtype else widen(values), dtype=dtype)
