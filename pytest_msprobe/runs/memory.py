"""Memory a check freed goes back to the operating system once the process holds a lot.

glibc keeps freed blocks below its mmap threshold in the heap, and it raises that threshold as large
blocks are freed, so a run of large items fragments the heap: identical runs of a realistic Llama step
peaked at 0.83 to 1.34 GiB. Trimming after every item bounds that (0.72 GiB) but costs about 7 % of the
run, since the next item faults its pages in again; so the heap is trimmed only while the process is
above TRIM_ABOVE, set so that the next item's own peak still leaves the process under 1 GiB (each trim
gives back 300-350 MiB of free heap that later items fault in again: at 768 MiB the 484-call Llama step
trimmed 11 times and faulted 425k pages in, at 832 MiB about 250k, with no trim at all 175-210k and a peak
of up to 995 MiB). Below it, freed memory stays with the process (keep_freed_memory): glibc would
otherwise unmap each large block when it is freed and give the top of the heap back, so that the next
item's tensors of the same sizes fault in and zero their pages again (5-12x the minor page faults, and
15-33 % of the time, of the optimizer step's addcdiv_ and addcmul_ items). Elsewhere (no glibc, no
/proc) this does nothing.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

TRIM_ABOVE = 832 << 20  # bytes of resident memory
HUGE_PAGES_FROM = 4 << 20  # bytes: fresh copies this large ask for transparent huge pages (numpy's limit too)
_MADV_HUGEPAGE = 14  # Linux's madvise advice
MMAP_THRESHOLD = 32 << 20  # blocks below this come from the heap: glibc's largest (64-bit)
# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


@functools.cache
def _libc_function(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(None), name, None)
    except OSError:  # no C library to load (not a POSIX system)
        return None


@functools.cache
def keep_freed_memory() -> None:
    """Fixed thresholds, once per process: blocks up to MMAP_THRESHOLD are reused from the heap, and the
    heap's top is given back only by release_freed_memory. glibc's defaults move with the blocks freed.
    One heap (arena) for every thread: the helper thread (helper.py) makes what the items' thread frees
    (the bench's side, the next item's inputs), and in an arena of its own it faulted fresh pages in while
    the freed blocks sat in the main heap (the realistic Llama step: 180k minor faults in all against 141k,
    the bench's casts there 1.5 ns per element against 0.65 on the items' thread, on an AMD EPYC with
    avx512_bf16). Set before the process's first item, so before the helper thread's first allocation."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None and _libc_function("malloc_trim") is not None:  # glibc's, not another libc's
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)  # an int; the default trims 2 * the mmap threshold
        mallopt(_M_ARENA_MAX, 1)


_statm: dict[int, int] = {}  # pid -> a descriptor of its /proc/self/statm (a forked child opens its own)


def resident_bytes() -> int:
    """This process's resident set size, or 0 where /proc cannot tell. Read after every item, through a
    descriptor kept open (1.5 us; opening the file each time cost 14 us of CPU)."""
    try:
        pid = os.getpid()
        fd = _statm.get(pid)
        if fd is None:
            fd = _statm[pid] = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return int(os.pread(fd, 128, 0).split()[1]) * _page_size()
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, or no os.pread (not POSIX)
        return 0


def release_freed_memory(above: int = TRIM_ABOVE) -> bool:
    """Give the heap's free pages back to the system when the process holds more than `above` bytes;
    whether it did."""
    trim = _libc_function("malloc_trim")
    if trim is not None and resident_bytes() > above:
        trim(0)
        return True
    return False


@functools.cache
def _madvise() -> Any:
    madvise = _libc_function("madvise")
    if madvise is not None:
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def fresh_copy(tensor: torch.Tensor, device: str, dtype: torch.dtype) -> torch.Tensor:
    """A fresh copy of `tensor` in `dtype` on `device`, as `tensor.to(device, dtype, copy=True)` makes it; a
    large one on the CPU in cpu_empty_like's memory."""
    if device.split(":")[0] != "cpu" or tensor.numel() * dtype.itemsize < HUGE_PAGES_FROM or _madvise() is None:
        return tensor.to(device=device, dtype=dtype, copy=True)
    return cpu_empty_like(tensor, dtype).copy_(tensor)


def cpu_empty_like(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor shaped (and strided) as `tensor`, in `dtype`, whose memory is advised for
    transparent huge pages before its first touch when it is large: a block above glibc's mmap threshold is
    mapped fresh and faulted in page by page, and 4 KiB faults cost more than a copy itself (16M bf16
    elements: a plain copy 1.0 ns per element, 0.3 with huge pages, on an AMD EPYC with THP on madvise).
    Where madvise is missing or refuses (no Linux, THP off) it is a plain empty tensor."""
    import torch

    fresh = torch.empty_like(tensor, dtype=dtype, device="cpu")  # preserve_format, as .to(copy=True)
    if fresh.numel() * dtype.itemsize >= HUGE_PAGES_FROM and _madvise() is not None:
        page = _page_size()
        start = fresh.untyped_storage().data_ptr()
        first, last = -(-start // page) * page, (start + fresh.untyped_storage().nbytes()) // page * page
        if last > first:
            _madvise()(first, last - first, _MADV_HUGEPAGE)
    return fresh


@functools.cache
def gib(n: float) -> str:
    """A size in bytes as people read it: 1.50 GiB, 384.0 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}" if unit != "GiB" else f"{n / (1 << shift):.2f} {unit}"
    return f"{int(n)} bytes"


_HEARING: list[Callable[[int, int], None]] = []  # who hears an item's estimate: at most one, the item's process


def hear_estimates(listener: Callable[[int, int], None] | None) -> None:
    """`listener(need, budget)` hears each check's memory estimate (bytes beside the device side, and the
    item's budget) before its runs start; None: no one."""
    _HEARING[:] = [] if listener is None else [listener]


def estimated(need: int, budget: int) -> None:
    """A check's memory estimate, told to the listener (the session leaves it where a crash report finds it)."""
    for listener in _HEARING:
        listener(need, budget)


def _page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
