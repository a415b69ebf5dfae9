"""The one thread a check may use beside its own, when the process has a spare core
(CheckOptions.work_threads > 1): it runs the bench (forward and backward) while the item's thread runs the
device and the third run (check.rerun), draws chunks of a large random tensor beside the item's thread
(inputs.build), builds the next item's inputs (check.prepare.prefetch) and computes a large output's
msprobe metrics while the item's thread runs the strict checks (check.compare.start_metrics). One thread
for every stage, so a process keeps at most two busy."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor


@functools.cache
def helper() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-helper")
