"""Give freed memory back to the system between the phases of a long analysis.

glibc serves a large allocation (a column of a long run: megabytes) with ``mmap`` and returns
it on ``free``, but after the first such free it raises that threshold to the freed size (up
to 32 MiB), so the next columns come from the heap, whose free pages stay with the process:
parsing a gigabyte log then computing its metrics kept ~150 MiB more resident than either
phase needs.  A fixed threshold (``mallopt(M_MMAP_THRESHOLD)``, the documented way to turn
the dynamic one off, as ``MALLOC_MMAP_THRESHOLD_`` does) keeps every large block
returnable.  Other C libraries, and other systems, are left as they are.

A fixed threshold has a cost where a phase allocates and frees many middle-sized blocks: the
reading of a log (its chunks of megabytes, and the arrays of each of its steps) then maps fresh
pages for each, and the page faults took a third of the report's CPU (on a 1 GB log of 64
ranks, 6.8 s of system time in 20.9 s).  ``reading`` raises the threshold while a log is
read, so those blocks come from the heap and are used again, then sets it back and gives the
heap's free pages back (``malloc_trim``) before the records are sorted and merged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number (glibc ``malloc.h``)."""
M_TRIM_THRESHOLD = -1
"""``mallopt`` parameter number: free bytes at the heap's top kept before it is trimmed."""
THRESHOLD_BYTES = 128 * 1024
"""glibc's own initial threshold, kept fixed (its initial trim threshold is the same)."""
READING_BYTES = 2 << 20
"""The threshold, and the trim threshold, while a log is read (``reading``): blocks up to
2 MiB (a step's arrays) come from the heap and are used again; the 8 MiB chunks and anything
larger are still mapped and returned, so what the heap keeps stays small.  On the 64-rank
stress log (1 GB), ``analysis.report.build`` took 20.9 s of CPU (6.8 of them system time) with the
fixed threshold, 16.5 s at 2 MiB, 15.3 s at 4 MiB; its peak RSS grew by 2 MiB at 2 MiB and
by 10 MiB at 4 MiB (the columns still in the heap when the records are merged)."""

_libc: ctypes.CDLL | None = None
"""glibc, once ``return_freed_memory`` has fixed its threshold (else None: left alone)."""


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold for this process; whether it was set (glibc only)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no mallopt threshold)
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
    _libc = libc if ok else None
    return ok


@contextmanager
def reading() -> Iterator[None]:
    """While a log is read: middle-sized blocks from the heap, used again (module doc); after,
    the fixed threshold back and the heap's free pages returned.  Nothing changes in a process
    whose threshold ``return_freed_memory`` did not fix (glibc's own dynamic one serves it)."""
    libc = _libc
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, READING_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, READING_BYTES)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES)
        libc.malloc_trim(0)
