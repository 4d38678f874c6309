"""Scratch buffers a kernel reuses from one call to the next, one set per thread.

A kernel's temporaries (a depthwise conv's gathered taps, its padded input) are megabytes that
a fresh ``numpy.empty`` maps anew on each call, where every first touch of a page costs a page
fault: on a small conv net that doubled the time of its depthwise convs. Kept here, they are
touched once per thread. A kernel never returns a scratch buffer (or a view of one): its results
are its own arrays.

The validate stage runs its samples in threads it starts for each validation, which would fault
every page in again (a small conv net's first call in a fresh thread ran 20-80% slower). So a run
of a program leases a set from a small pool for its length (``lease``): whichever thread ran the
last one, the next run finds its buffers warm. Outside a lease (an evaluator called directly) a
thread keeps a set of its own, handed to the pool when the thread ends.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np

#: bytes above which a buffer is allocated afresh for each call rather than kept (its work
#: outweighs the faults; a large image's buffers would otherwise stay held for good)
KEPT_BYTES = 16 << 20
#: buffer sets of ended threads kept for the threads to come (as many as run samples at once)
POOLED_SETS = 4

_local = threading.local()
_pool: list[dict] = []  # sets left by ended threads, for the next threads to take over
_pool_lock = threading.Lock()


class _ThreadBuffers(dict):
    """{name: buffer} of one thread, handed to the pool when the thread ends (its thread-local
    storage goes then, and this with it)."""

    def __del__(self):
        try:
            _handed_back(dict(self))
        except Exception:  # noqa: BLE001, S110 - the interpreter shutting down: nothing to keep
            pass


def _taken() -> dict:
    with _pool_lock:
        return _pool.pop() if _pool else {}


def _handed_back(buffers: dict) -> None:
    with _pool_lock:
        if len(_pool) < POOLED_SETS:
            _pool.append(buffers)


@contextlib.contextmanager
def lease():
    """The calling thread's scratch buffers for the block: a set from the pool, handed back at
    its end (a block inside another keeps the outer one's). Nothing returned from the block
    may be a scratch buffer: the next lease may hand it to another thread."""
    if getattr(_local, "leased", None) is not None:
        yield
        return
    buffers = _local.leased = _taken()
    try:
        yield
    finally:
        _local.leased = None
        _handed_back(buffers)


def _thread_buffers() -> dict:
    buffers = getattr(_local, "leased", None)
    if buffers is not None:
        return buffers
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = _ThreadBuffers(_taken())
    return buffers


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype``, valid until this thread asks for
    ``name`` again."""
    dtype = np.dtype(dtype)
    nbytes = int(math.prod(shape)) * dtype.itemsize  # numpy's prod costs a small kernel's call more
    if nbytes > KEPT_BYTES:
        return np.empty(shape, dtype)
    buffers = _thread_buffers()
    buffer = buffers.get(name)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = buffers[name] = np.empty(max(nbytes, 1), np.uint8)
    return buffer[:nbytes].view(dtype).reshape(shape)
