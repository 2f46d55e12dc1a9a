"""Give freed memory back to the system between the phases of a long analysis.

glibc serves a large allocation (a column of a long run: megabytes) with ``mmap`` and returns
it on ``free``, but after the first such free it raises that threshold to the freed size (up
to 32 MiB), so the next columns come from the heap, whose free pages stay with the process:
parsing a gigabyte log then computing its metrics kept ~150 MiB more resident than either
phase needs.  A fixed threshold (``mallopt(M_MMAP_THRESHOLD)``, the documented way to turn
the dynamic one off, as ``MALLOC_MMAP_THRESHOLD_`` does) keeps every large block
returnable.  Other C libraries, and other systems, are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number (glibc ``malloc.h``)."""
THRESHOLD_BYTES = 128 * 1024
"""glibc's own initial threshold, kept fixed."""


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold for this process; whether it was set (glibc only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no mallopt threshold)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
