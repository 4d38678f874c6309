"""Process memory hygiene for the conversion: what numpy frees should leave the resident set.

Weights are tens to thousands of MB and the interpreter's activations several MB each; with
glibc's default heuristics freed blocks of that size stay in the heap, resident, and a build's
peak grows with every pass that allocates and frees them. Both helpers are no-ops on other
C libraries.
"""

from __future__ import annotations

from edgebuild.plugin.pages import drop_resident_ranges, libc_function

from contextlib import contextmanager

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter number
GLIBC_DEFAULT_THRESHOLD = 128 * 1024  # both thresholds' values before glibc adjusts them
KEPT_HEAP_BYTES = 64 << 20  # freed_blocks_kept: freed heap kept this far above its top
MAPPED_BLOCK_BYTES = 256 * 1024  # map_large_blocks: blocks this large are mapped on their own
REUSED_BLOCK_BYTES = 32 << 20  # heap_blocks_reused: up to this (glibc's largest threshold) from the heap
_large_blocks_mapped = False


def return_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc only; a no-op elsewhere).

    The interpreter's activations are a few MB each: once glibc has seen such blocks freed it
    serves them from its heap, which keeps freed pages resident and would add them to the peak
    of the conversion that follows.
    """
    import gc

    gc.collect()
    trim = libc_function("malloc_trim")
    if trim is not None:
        trim(0)


def map_large_blocks() -> None:
    """Have glibc map every block of 256 KiB or more on its own (M_MMAP_THRESHOLD), so an
    activation freed by the interpreter goes back to the OS at once. glibc otherwise raises
    its threshold to the largest block freed so far and keeps later ones of that size in the
    heap, where they stay resident."""
    global _large_blocks_mapped
    mallopt = libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MAPPED_BLOCK_BYTES)
        _large_blocks_mapped = True


@contextmanager
def heap_blocks_reused():
    """Within: blocks below REUSED_BLOCK_BYTES come from glibc's heap again (when
    :func:`map_large_blocks` is in effect; else nothing changes), and the freed heap pages are
    handed back to the OS as the block ends.

    For repeated runs of the interpreter (the fp16 guard's calibration samples): each activation
    mapped on its own is a fresh mapping whose every page faults in zeroed (a 416x416 conv net's
    run: 0.145 s that way, 0.114 s from the heap); from the heap, a run reuses what the previous
    op freed. The resident set is
    trimmed after each sample by the caller (:func:`return_freed_memory`), and again here.
    """
    mallopt = libc_function("mallopt")
    if mallopt is None or not _large_blocks_mapped:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, REUSED_BLOCK_BYTES)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, MAPPED_BLOCK_BYTES)
        return_freed_memory()


@contextmanager
def freed_blocks_kept():
    """Within: blocks below REUSED_BLOCK_BYTES come from glibc's heap, and what is freed stays
    there (up to KEPT_HEAP_BYTES) for the next block of that size; the freed pages go back to
    the OS as the block ends.

    For a loop that makes and frees temporaries of a few MB per step (a weight quantised slice
    by slice): each block mapped on its own, or taken back from a heap trimmed at every free, is
    memory whose every page faults in zeroed again. Over the 2.2 GB of a 1.1B decoder's fp16
    weights that was three million page faults, half the compress stage's CPU time. The working
    set stays what the loop holds at once. After the block, the mapping threshold is
    :func:`map_large_blocks`' when it was in effect, else glibc's starting value, which glibc no
    longer raises on its own once set.
    """
    mallopt = libc_function("mallopt")
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, REUSED_BLOCK_BYTES)
    mallopt(M_TRIM_THRESHOLD, KEPT_HEAP_BYTES)
    try:
        yield
    finally:
        mallopt(M_TRIM_THRESHOLD, GLIBC_DEFAULT_THRESHOLD)
        mallopt(M_MMAP_THRESHOLD, MAPPED_BLOCK_BYTES if _large_blocks_mapped else GLIBC_DEFAULT_THRESHOLD)
        return_freed_memory()


def drop_mapped_pages(arrays) -> int:
    """Drop the resident pages of read-only numpy arrays that view a mapped file (a lowered
    weight viewing its initializer); returns the bytes advised. Reading one again faults its bytes
    back in from the file, so only the resident set changes: a pass that reads every weight once
    (a hash, the fp16 cast) otherwise ends with all of them resident until the last view goes.
    Writable arrays are left alone (a private page written to would be lost)."""
    import numpy as np

    read_only, others = [], []
    for array in arrays:
        if isinstance(array, np.ndarray) and not array.flags.writeable:
            low, high = np.lib.array_utils.byte_bounds(array)
            (read_only if views_read_only_mmap(array) else others).append((low, high - low))
    return (drop_resident_ranges(read_only, read_only_mapped=True) if read_only else 0) + (
        drop_resident_ranges(others) if others else 0)


def views_read_only_mmap(array) -> bool:
    """Whether ``array``'s memory belongs to a Python ``mmap`` opened read-only (as onnx_ir maps
    external weights): such a mapping was never writable, so its pages can always be dropped."""
    import mmap

    import numpy as np

    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's base: a view of the buffer's owner
        base = base.obj
    if not isinstance(base, mmap.mmap) or base.closed:
        return False
    with memoryview(base) as view:
        return view.readonly
