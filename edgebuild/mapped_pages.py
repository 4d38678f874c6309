"""Drop resident pages of memory-mapped weights, for any backend or frontend.

A weight read from a mapped file costs nothing until read, but every page read stays in the
process's resident set until the mapping goes: a pass that reads each of a billion-parameter
model's weights once (a hash, an fp16 cast, an eager call) would end with all of them resident.
``madvise(MADV_DONTNEED)`` drops a range of a file mapping; a later read faults the file's bytes
back in. Only ranges inside a mapping of a file (``/proc/self/maps``) are dropped: anonymous
memory would read back as zeros. The caller vouches that the range was never written (a written
page of a private mapping would be lost). A no-op where /proc or glibc's madvise are missing.
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Iterable

MADV_DONTNEED = 4  # Linux
MIN_BYTES = 1 << 20  # smaller ranges are not worth a system call


@functools.cache
def libc_function(name: str):
    """A C library function by name, or None (another C library, or no ctypes). Cached: finding
    the library runs ``ldconfig -p`` in a subprocess, and callers ask once per weight."""
    import ctypes
    import ctypes.util

    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library, use_errno=True), name) if library else None
    except (OSError, AttributeError):
        return None


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of files (Linux /proc; empty elsewhere)."""
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/"):
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    ranges.append((start, end))
    except OSError:
        return []
    return ranges


def drop_resident_ranges(ranges: Iterable[tuple[int, int]]) -> int:
    """Drop the resident pages of each (address, bytes) range that lies in a file mapping, whole
    pages inside the range only (its neighbours stay); returns the bytes advised."""
    ranges = [(start, size) for start, size in ranges if size >= MIN_BYTES]
    madvise = libc_function("madvise") if ranges else None
    mappings = _file_mappings() if madvise is not None else []
    if not mappings:
        return 0
    import ctypes

    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page, advised = mmap.PAGESIZE, 0
    for start, size in ranges:
        if not any(lo <= start and start + size <= hi for lo, hi in mappings):
            continue
        first, last = -(-start // page) * page, (start + size) // page * page
        if last > first and madvise(first, last - first, MADV_DONTNEED) == 0:
            advised += last - first
    return advised
