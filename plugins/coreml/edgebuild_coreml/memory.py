"""Process memory hygiene for the conversion: what numpy frees should leave the resident set.

Weights are tens to thousands of MB and the interpreter's activations several MB each; with
glibc's default heuristics freed blocks of that size stay in the heap, resident, and a build's
peak grows with every pass that allocates and frees them. Both helpers are no-ops on other
C libraries.
"""

from __future__ import annotations

from edgebuild.mapped_pages import drop_resident_ranges, libc_function

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


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
    mallopt = libc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 256 * 1024)


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
