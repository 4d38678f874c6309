"""An MLIR location as the Python source line a person can look up.

The bindings expose no accessors for a location's parts, so its printed form is read: JAX writes
``loc("jit(f)/dot_general"(callsite("f"("model.py":12:8 to :20) at ...)))``, and the first
``"file":line`` in it is the innermost frame, the line that called the primitive.
"""

from __future__ import annotations

import re

_FILE_LINE = re.compile(r'"([^"]+)":(\d+)(?::(\d+))?')
_NAME = re.compile(r'^loc\("([^"]*)"')


def source_line(location) -> str:
    """``model.py:12 (jit(f)/dot_general)``, or the location's name alone, or ``unknown location``."""
    text = str(location)
    name = _NAME.match(text)
    where = next((m for m in _FILE_LINE.finditer(text) if not (name and m.start() == name.start(1) - 1)), None)
    label = name.group(1) if name else None
    if where is not None:
        place = f"{where.group(1)}:{where.group(2)}"
        return f"{place} ({label})" if label else place
    return label or "unknown location"
