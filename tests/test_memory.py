"""Freed memory goes back to the OS between items (runs/memory.py)."""
from __future__ import annotations

import math
import mmap
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pytest_msprobe.runs import memory


def _rss_pages() -> int:
    return memory.resident_bytes() // 4096


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's; elsewhere release does nothing")
def test_freed_heap_memory_goes_back_to_the_os() -> None:
    assert memory._libc_function("malloc_trim") is not None
    big = np.ones(4_000_000)
    del big  # freeing a 32 MB mmapped block raises glibc's mmap threshold: 800 kB blocks now live in the heap
    blocks = [np.ones(100_000) for _ in range(400)]  # 320 MB
    top = blocks[-1]  # one live block at the top: the heap cannot shrink by itself
    allocated = _rss_pages()
    del blocks
    freed = _rss_pages()
    assert not memory.release_freed_memory(above=freed * 4096 * 2)  # below the limit: kept
    assert _rss_pages() > freed * 0.9
    assert memory.release_freed_memory(above=0)
    trimmed = _rss_pages()
    assert top.sum() == 100_000
    if freed < allocated * 0.9:  # an earlier test's heap state let glibc give it back by itself
        pytest.skip(f"freeing alone returned memory ({allocated} -> {freed} pages): nothing left to trim")
    dropped_pages = 399 * 800_000 // 4096  # the blocks freed
    assert freed - trimmed > dropped_pages // 2, (allocated, freed, trimmed)  # other live memory stays


def test_release_is_harmless_anywhere() -> None:
    memory.release_freed_memory()
    memory.release_freed_memory()


def _fresh_pages(size: int) -> mmap.mmap:
    """`size` bytes of a fresh anonymous mapping, every page written: resident memory the process did not
    hold before (a numpy array may reuse heap pages that earlier tests freed and the process kept)."""
    block = mmap.mmap(-1, size)
    np.frombuffer(block, dtype=np.uint8)[::4096] = 1
    return block


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="no /proc: resident_bytes() is 0 there")
def test_resident_bytes_follows_this_process() -> None:
    """The kept descriptor reads the current value each time, as opening the file does."""
    def opened() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    before = memory.resident_bytes()
    assert abs(before - opened()) < 8 << 20
    block = _fresh_pages(64 << 20)
    grown = memory.resident_bytes()
    assert grown - before > 56 << 20
    assert abs(grown - opened()) < 8 << 20
    block.close()


@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/statm").is_file(), reason="needs fork and /proc")
def test_a_forked_child_reads_its_own_resident_set() -> None:
    """The descriptor is per process: a child forked after the parent's first read must not read the parent's
    /proc/<pid>/statm through the inherited descriptor."""
    at_fork = memory.resident_bytes()  # the parent's descriptor is open now
    pid = os.fork()
    if pid == 0:  # the child: only os-level calls and a numpy allocation
        code = 1
        try:
            start = memory.resident_bytes()
            block = _fresh_pages(192 << 20)  # the child's own pages
            code = 0 if memory.resident_bytes() - start > 150 << 20 else 1
            block.close()
        finally:
            os._exit(code)  # never back into pytest
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert memory.resident_bytes() - at_fork < 100 << 20  # the parent's own value, without the child's block


_REFAULTS = """
import resource, sys
import numpy as np
from pytest_msprobe.runs import memory
if sys.argv[1] == "keep":
    memory.keep_freed_memory()
block = np.ones(2 << 20)  # 16 MiB: under glibc's largest mmap threshold, over its first one
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = np.ones(2 << 20)  # the same size again, as the next item's tensor would be
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_a_freed_block_is_reused_without_faulting_its_pages_in_again() -> None:
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _REFAULTS, mode], capture_output=True, text=True, check=True)
        return int(done.stdout)

    default = faults("default")  # glibc gave the block back, and maps and zeroes it again
    assert default >= 100  # a fault per 4 KiB page, or per larger folio where the kernel maps those
    assert faults("keep") * 20 < default  # kept in the heap: its pages are still there


_THREAD_REFAULTS = """
import resource, sys, threading
import numpy as np
from pytest_msprobe.runs import memory
if sys.argv[1] == "keep":
    memory.keep_freed_memory()
block = np.ones(2 << 20)  # freed by the items' thread ...
del block
faults = []

def helper():
    np.ones(16)  # the thread's first allocation: glibc gives it an arena
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.ones(2 << 20)  # ... and the same size made in the helper thread, as the bench's side is
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

thread = threading.Thread(target=helper)
thread.start()
thread.join()
print(faults[0])
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's arenas are glibc's")
def test_the_helper_thread_reuses_a_block_the_items_thread_freed() -> None:
    """One heap for both threads: in an arena of its own, the helper would map and zero fresh pages for what it
    makes (the bench's side, the next item's inputs) while the items' thread's freed blocks sat unused."""
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _THREAD_REFAULTS, mode], capture_output=True, text=True,
                              check=True)
        return int(done.stdout)

    default = faults("default")  # the thread's own arena: a fresh heap
    assert default >= 100
    assert faults("keep") * 20 < default


@pytest.mark.parametrize("shape, dtype", [((1 << 22,), torch.float32), ((2048, 1536), torch.bfloat16), ((7,), torch.float16)])
def test_a_fresh_cpu_copy_is_made_in_advised_memory(monkeypatch, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """The side copies (runs/execution.make_side) are torch's own copy, strides included, in memory advised for
    huge pages (page-aligned, inside the tensor's storage) when large, and never the input's memory."""
    advised: list[tuple[int, int, int]] = []
    monkeypatch.setattr(memory, "_madvise", lambda: lambda start, length, advice: advised.append((start, length, advice)))
    source = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
    source = source.t() if source.dim() == 2 else source  # non-contiguous: strides are preserved as .to does
    copy = memory.fresh_copy(source, "cpu", dtype)
    expected = source.to(device="cpu", dtype=dtype, copy=True)
    assert torch.equal(copy, expected) and copy.stride() == expected.stride() and copy.dtype == dtype
    assert copy.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()
    large = copy.numel() * dtype.itemsize >= memory.HUGE_PAGES_FROM
    assert len(advised) == int(large)
    if large:
        start, length, advice = advised[0]
        begin, nbytes = copy.untyped_storage().data_ptr(), copy.untyped_storage().nbytes()
        assert advice == 14 and start % 4096 == 0 and length % 4096 == 0
        assert begin <= start and start + length <= begin + nbytes and length >= nbytes - 2 * 4096
