"""Scratch buffers a kernel reuses from one call to the next, one set per thread.

A kernel's temporaries (a depthwise conv's gathered taps, its padded input) are megabytes that
a fresh ``numpy.empty`` maps anew on each call, where every first touch of a page costs a page
fault: on a small conv net that doubled the time of its depthwise convs. Kept here, they are
touched once per thread. A kernel never returns a scratch buffer (or a view of one): its results
are its own arrays.
"""

from __future__ import annotations

import threading

import numpy as np

#: bytes above which a buffer is allocated afresh for each call rather than kept (its work
#: outweighs the faults; a large image's buffers would otherwise stay held for good)
KEPT_BYTES = 16 << 20

_local = threading.local()


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype``, valid until this thread asks for
    ``name`` again."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes > KEPT_BYTES:
        return np.empty(shape, dtype)
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    buffer = buffers.get(name)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = buffers[name] = np.empty(max(nbytes, 1), np.uint8)
    return buffer[:nbytes].view(dtype).reshape(shape)
