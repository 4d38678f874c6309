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


def drop_resident_ranges(ranges: Iterable[tuple[int, int]], *, read_only_mapped: bool = False) -> int:
    """Drop the resident pages of each (address, bytes) range that lies in a file mapping, whole
    pages inside the range only (its neighbours stay); returns the bytes advised.

    ``read_only_mapped``: the caller knows every range lies in a mapping made read-only from the
    start (``mmap.ACCESS_READ``), whose pages read back unchanged from the file (or as the zeros
    they were), so /proc is not read: with a thousand mappings, a look costs milliseconds, once
    per weight of a model with hundreds."""
    ranges = [(start, size) for start, size in ranges if size >= MIN_BYTES]
    madvise = libc_function("madvise") if ranges else None
    if madvise is None:
        return 0
    mappings = None if read_only_mapped else _file_mappings()
    if mappings is not None and not mappings:
        return 0
    import ctypes

    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page, advised = mmap.PAGESIZE, 0
    for start, size in ranges:
        if mappings is not None and not any(lo <= start and start + size <= hi for lo, hi in mappings):
            continue
        first, last = -(-start // page) * page, (start + size) // page * page
        if last > first and madvise(first, last - first, MADV_DONTNEED) == 0:
            advised += last - first
    return advised


def file_offsets(path) -> list[tuple[int, int, int]] | None:
    """(start, end, file offset) of each mapping of the file at ``path`` in this process, or None
    when one of them holds a written page (``Anonymous`` in ``/proc/self/smaps``: a private
    mapping's copy-on-write page, which no longer equals the file) or /proc is missing. An address
    ``a`` inside a listed mapping holds the file's byte ``offset + a - start``."""
    import os

    try:
        stat = os.stat(path)
        found, current = [], None
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                    current = None
                    major, minor = (int(x, 16) for x in fields[3].split(":"))
                    if int(fields[4]) == stat.st_ino and os.makedev(major, minor) == stat.st_dev:
                        start, end = (int(x, 16) for x in fields[0].split("-"))
                        current = (start, end, int(fields[2], 16))
                        found.append(current)
                elif current is not None and fields[0] == "Anonymous:" and int(fields[1]) > 0:
                    return None
    except (OSError, ValueError, IndexError):
        return None
    return found
