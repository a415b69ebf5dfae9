"""The one thread a check may use beside its own, when the process has a spare core
(CheckOptions.work_threads > 1): it builds the next item's inputs (prepare.prefetch) and computes a
large output's msprobe metrics while the item's own thread runs the torch run and the strict checks
(compare.start_metrics). One thread for both jobs, queued in the order they are asked for."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor


@functools.cache
def helper() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-helper")
