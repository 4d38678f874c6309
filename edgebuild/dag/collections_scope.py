"""Garbage collections inside a stage body walk only what the body made.

A conversion process holds hundreds of thousands of library objects (onnx, onnxscript, sympy,
coremltools) that no stage will free, and every full collection walked them all: the automatic
ones during a stage and the explicit ones that free a stage's cyclic graphs (an ONNX or MIL
graph with its weights), about a tenth of a second each. ``gc.freeze`` moves every object alive
when a body starts into the permanent generation, which collections skip; as the body ends, one
collection (over the body's own objects) frees what it left behind, so the next body starts with
no garbage to freeze, and the objects go back to the collector.

Nested and concurrent scopes (a backend freezing again after its own imports, ``-j N`` threads)
unfreeze with the last one to end; meanwhile garbage another body made before a scope started
waits for it (a delayed free, never a lost one).
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_open = 0  # scopes entered and not yet left, process-wide


@contextmanager
def older_objects_frozen(*, collect_at_end: bool = False):
    """Within: collections skip the objects alive on entry. ``collect_at_end``: collect the
    scope's own garbage before leaving (a stage body's cyclic graphs)."""
    global _open
    with _lock:
        gc.freeze()
        _open += 1
    try:
        yield
    finally:
        if collect_at_end:
            gc.collect()
        with _lock:
            _open -= 1
            if _open == 0:
                gc.unfreeze()
