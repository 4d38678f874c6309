"""MIL list ops (make_list, list_read/write/length/gather/scatter).

A list value is a Python list of numpy arrays (None for never-written slots); writes return
a new list so a list captured by a loop iteration is never changed behind its back.
"""

from __future__ import annotations

import numpy as np

from .registry import evaluates


@evaluates("make_list")
def make_list(op, x):
    from coremltools.converters.mil.mil import types

    length = int(x.get("init_length", 1))
    dims = x.get("elem_shape") or []
    try:
        shape = [int(d) for d in dims]
    except (TypeError, ValueError):  # symbolic element shape: known once written
        return [None] * length
    dtype = types.string_to_nptype(str(x.get("dtype", "fp32")))
    return [np.zeros(shape, dtype) for _ in range(length)]


def _extended(items: list, size: int) -> list:
    return list(items) + [None] * max(0, size - len(items))


@evaluates("list_write")
def list_write(op, x):
    index = int(x["index"])
    items = _extended(x["ls"], index + 1)
    items[index] = np.asarray(x["value"])
    return items


@evaluates("list_read")
def list_read(op, x):
    item = x["ls"][int(x["index"])]
    if item is None:
        raise ValueError(f"list element {int(x['index'])} is read before it is written")
    return item


@evaluates("list_length")
def list_length(op, x):
    return np.int32(len(x["ls"]))


@evaluates("list_gather")
def list_gather(op, x):
    indices = np.atleast_1d(x["indices"])
    return np.stack([list_read(op, {"ls": x["ls"], "index": i}) for i in indices])


@evaluates("list_scatter")
def list_scatter(op, x):
    indices = [int(i) for i in np.atleast_1d(x["indices"])]
    items = _extended(x["ls"], max(indices, default=-1) + 1)
    for position, index in enumerate(indices):
        items[index] = np.asarray(x["value"][position])
    return items
