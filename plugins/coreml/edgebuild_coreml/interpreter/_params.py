"""Reading op parameters with the MIL op's documented defaults.

The executor passes evaluated inputs; an optional parameter may be missing (or None) when a
program was loaded back from a serialized model. ``param`` falls back to the op class's own
``default_inputs()`` so every evaluator follows the spec's defaults without repeating them.
"""

from __future__ import annotations

from operator import is_

import numpy as np

from . import torch_kernels as kernels


def param(op, x: dict, name: str, fallback=None):
    """Value of parameter ``name``: the given input, else the op's default, else ``fallback``."""
    value = x.get(name)
    if value is not None:
        return value
    value = _defaults_of(op).get(name)
    return fallback if value is None else value


_DEFAULTS_ATTRIBUTE = "_edgebuild_default_inputs"


def _defaults_of(op) -> dict:
    """The op's ``default_inputs()``, worked out once per op (it builds Vars: costly per sample)."""
    defaults = getattr(op, _DEFAULTS_ATTRIBUTE, None)
    if defaults is None:
        defaults = {}
        default_inputs = getattr(op, "default_inputs", None)
        if default_inputs is not None:
            try:
                defaults = dict(default_inputs().items())
            except Exception:  # default_inputs may need input shapes that a loaded op lacks
                defaults = {}
        try:
            setattr(op, _DEFAULTS_ATTRIBUTE, defaults)
        except AttributeError:  # an object without attributes of its own (tests pass stand-ins)
            pass
    return defaults


def scalar(value):
    """A python scalar from a 0-d (or 1-element) array, str or number."""
    if isinstance(value, np.ndarray):
        return value.reshape(-1)[0].item() if value.size == 1 else value
    if isinstance(value, np.generic):
        return value.item()
    return value


def ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def as_float(value) -> np.ndarray:
    """Compute in fp32 at least: fp16 inputs are widened, the executor casts results back."""
    arr = np.asarray(value)
    if arr.dtype == np.float16:
        return kernels.cast(arr, np.float32)
    return arr if arr.dtype == np.float64 else arr.astype(np.float32, copy=False)


def per_channel(values, rank: int) -> np.ndarray:
    """Reshape a [C] vector to broadcast along axis 1 of a rank-``rank`` tensor."""
    return np.asarray(values).reshape((1, -1) + (1,) * (rank - 2))


def channel_bias(bias, out: np.ndarray) -> tuple[np.ndarray, bool]:
    """(``bias`` [C] shaped to add along ``out``'s channels (axis 1), whether it adds in place:
    the result type is ``out``'s own)."""
    shaped = per_channel(as_float(bias), out.ndim)
    return shaped, np.result_type(out, shaped) == out.dtype


def per_op(op, attribute: str, sources: tuple, shapes: tuple, make):
    """``make()``, worked out once per op and kept on it (as ``attribute``) while the op is given
    the same ``sources`` (its constant parameters and weights: the plan's objects, the same every
    run, compared by identity and held so their ids stay theirs) and equal ``shapes``: what
    depends only on those (parsed parameters, broadcast checks, reshaped weights) costs a small
    op's run as much as its arithmetic."""
    cached = getattr(op, attribute, None)
    if (cached is not None and cached[1] == shapes and len(cached[0]) == len(sources)
            and all(map(is_, cached[0], sources))):
        return cached[2]
    value = make()
    try:
        setattr(op, attribute, (sources, shapes, value))
    except AttributeError:  # an object without attributes of its own (tests pass stand-ins)
        pass
    return value
