"""Memory-mapped weights that do not stay resident once read.

A state_dict read from safetensors (or ``torch.load(mmap=True)``) is a private mapping of the file:
its pages cost nothing until read, but every page read stays in the process's resident set until the
mapping goes. The PyTorch route reads every weight twice (the eager call that names the outputs, the
export that writes them), so a billion-parameter model would end each pass with all of its fp32 bytes
resident. ``madvise(MADV_DONTNEED)`` drops a range of such a mapping; a later read faults the file's
bytes back in, so only parameters, which inference never writes, are dropped, and only where
``/proc/self/maps`` shows a mapping of a file (anonymous memory would read back as zeros).
"""

from __future__ import annotations

import contextlib
import functools
import mmap
from collections.abc import Iterable, Iterator

MADV_DONTNEED = 4  # Linux
MIN_BYTES = 1 << 20  # smaller tensors are not worth a system call


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of every mapping of a file in this process (Linux; empty elsewhere)."""
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/") and fields[1].endswith("p"):
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    ranges.append((start, end))
    except OSError:
        return []
    return ranges


@functools.lru_cache(maxsize=None)
def _madvise():  # cached: find_library runs ldconfig in a subprocess, and this is asked per weight
    import ctypes
    import ctypes.util

    library = ctypes.util.find_library("c")
    try:
        function = ctypes.CDLL(library, use_errno=True).madvise if library else None
    except (OSError, AttributeError):
        return None
    if function is not None:
        function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return function


def drop_resident_pages(tensors: Iterable) -> int:
    """Drop the resident pages of those ``tensors`` that live in a private file mapping; returns the
    bytes advised. A no-op where /proc or madvise are missing."""
    madvise = _madvise()
    mappings = _file_mappings()
    if madvise is None or not mappings:
        return 0
    page = mmap.PAGESIZE
    advised = 0
    for tensor in tensors:
        start = tensor.data_ptr()
        size = tensor.numel() * tensor.element_size()
        if size < MIN_BYTES or not any(lo <= start and start + size <= hi for lo, hi in mappings):
            continue
        first = -(-start // page) * page  # whole pages inside the tensor only: neighbours stay
        last = (start + size) // page * page
        if last > first and madvise(first, last - first, MADV_DONTNEED) == 0:
            advised += last - first
    return advised


@contextlib.contextmanager
def pages_dropped_after_use(module) -> Iterator[None]:
    """While inside, each submodule's own parameters are dropped after its forward ran, so an
    eager call over a mapped model keeps about one layer of weights resident."""
    def after_forward(submodule, _inputs, _output):
        drop_resident_pages(submodule.parameters(recurse=False))

    handles = [sub.register_forward_hook(after_forward) for sub in module.modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        drop_resident_pages(module.parameters())
