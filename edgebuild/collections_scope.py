"""Garbage collections inside a stage body walk only what the body made.

A conversion process holds hundreds of thousands of library objects (onnx, onnxscript, sympy,
coremltools) that no stage will free, and every full collection walked them all: the automatic
ones during a stage and the explicit ones that free a stage's cyclic graphs (an ONNX or MIL
graph with its weights), about a tenth of a second each. ``gc.freeze`` moves every object alive
when a body starts into the permanent generation, which collections skip; as the body ends, one
collection (over the body's own objects) frees what it left behind, so the next body starts with
no garbage to freeze, and the objects go back to the collector.

Within a scope the youngest generation is also collected less often: an exporter or a MIL pass
makes millions of short-lived container objects, and at CPython's default (every 700 net
allocations) a 1.1B decoder's PyTorch build spent about 3.7 s in young collections, 2.1 s with
the threshold below. The garbage that waits is small objects; graphs holding weights are freed
by the bodies' explicit collections, as before.

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
_YOUNG_THRESHOLD = 100_000  # allocations between collections of the youngest generation
_outside: tuple[int, int, int] | None = None  # the thresholds to restore when the last scope ends


@contextmanager
def older_objects_frozen(*, collect_at_end: bool = False):
    """Within: collections skip the objects alive on entry. ``collect_at_end``: collect the
    scope's own garbage before leaving (a stage body's cyclic graphs)."""
    global _open, _outside
    with _lock:
        gc.freeze()
        if _open == 0:
            _outside = gc.get_threshold()
            if _outside[0]:  # (0: collection switched off, left so)
                gc.set_threshold(max(_YOUNG_THRESHOLD, _outside[0]), *_outside[1:])
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
                gc.set_threshold(*_outside)
