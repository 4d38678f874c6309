"""Process memory hygiene for the conversion: what numpy frees should leave the resident set.

Weights are tens to thousands of MB and the interpreter's activations several MB each; with
glibc's default heuristics freed blocks of that size stay in the heap, resident, and a build's
peak grows with every pass that allocates and frees them. Both helpers are no-ops on other
C libraries.
"""

from __future__ import annotations

import functools

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


@functools.lru_cache(maxsize=None)
def _libc_function(name: str):
    """A glibc function by name, or None (another C library, or no ctypes). Cached: finding the
    library runs ``ldconfig -p`` in a subprocess, and the fp16 cast asks once per weight."""
    import ctypes
    import ctypes.util

    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name) if library else None
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc only; a no-op elsewhere).

    The interpreter's activations are a few MB each: once glibc has seen such blocks freed it
    serves them from its heap, which keeps freed pages resident and would add them to the peak
    of the conversion that follows.
    """
    import gc

    gc.collect()
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


def map_large_blocks() -> None:
    """Have glibc map every block of 256 KiB or more on its own (M_MMAP_THRESHOLD), so an
    activation freed by the interpreter goes back to the OS at once. glibc otherwise raises
    its threshold to the largest block freed so far and keeps later ones of that size in the
    heap, where they stay resident."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 256 * 1024)


MADV_DONTNEED = 4  # Linux
MIN_DROPPED_BYTES = 1 << 20


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


def drop_mapped_pages(arrays) -> int:
    """Drop the resident pages of read-only numpy arrays that view a mapped file (a lowered
    weight viewing its initializer); returns the bytes advised. Reading one again faults its bytes
    back in from the file, so only the resident set changes: a pass that reads every weight once
    (a hash, the fp16 cast) otherwise ends with all of them resident until the last view goes.
    Writable arrays are left alone (a private page written to would be lost)."""
    import mmap

    import numpy as np

    arrays = [a for a in arrays if isinstance(a, np.ndarray) and not a.flags.writeable and a.nbytes >= MIN_DROPPED_BYTES]
    madvise = _libc_function("madvise") if arrays else None
    mappings = _file_mappings() if madvise is not None else []
    if not mappings:
        return 0
    import ctypes

    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page, advised = mmap.PAGESIZE, 0
    for array in arrays:
        low, high = np.lib.array_utils.byte_bounds(array)
        if not any(lo <= low and high <= hi for lo, hi in mappings):
            continue
        first, last = -(-low // page) * page, high // page * page  # whole pages of this array only
        if last > first and madvise(first, last - first, MADV_DONTNEED) == 0:
            advised += last - first
    return advised
