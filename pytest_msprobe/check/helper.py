"""The one thread a check may use beside its own, when the process has a spare core
(CheckOptions.work_threads > 1): it builds the next item's inputs and runs a large output's strict
checks. One thread, so that a process never keeps more than two cores busy."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor


@functools.cache
def helper() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-helper")
