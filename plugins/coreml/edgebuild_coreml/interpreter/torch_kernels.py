"""Kernels PyTorch does several times faster than numpy, used where it is installed and the
interpreter validates an artifact (``enable``): fp16 <-> fp32 casts (numpy converts half floats
one element at a time, F16C or not, which made fp16 emulation cost more in casts than in
arithmetic), 2-D convolutions that are not one matrix product (depthwise, strided, k x k) and
erf / exact GELU in float32 (the numpy reference computes them in float64 series, most of a
transformer's time).

Elsewhere (the fp16 guard, tests, a machine without torch) the numpy kernels run; both give
the same casts bit for bit and the same convolutions up to summation order. Nothing here runs a
model: each function is one kernel on arrays the interpreter hands it.
"""

from __future__ import annotations

import numpy as np

_torch = None  # the torch module once enabled


def enable(threads: int | None = None) -> bool:
    """Use torch's kernels from now on in this process, if torch is installed; ``threads``:
    its intra-op pool size (1 in a worker process that shares the cores with another)."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError:
            return False
        _torch = torch
    if threads is not None:
        _torch.set_num_threads(threads)
    return True


def disable() -> None:
    global _torch
    _torch = None


def enabled() -> bool:
    return _torch is not None


_HALF_PAIRS = {(np.dtype(np.float16), np.dtype(np.float32)), (np.dtype(np.float32), np.dtype(np.float16))}
MIN_CAST_ELEMENTS = 4096  # below this numpy's per-call cost is the lower one


def cast(array: np.ndarray, dtype) -> np.ndarray:
    """``array.astype(dtype)`` (a new array of numpy's own, so later ops may overwrite it),
    through torch for fp16 <-> fp32 when enabled."""
    dtype = np.dtype(dtype)
    if (_torch is None or (array.dtype, dtype) not in _HALF_PAIRS or array.size < MIN_CAST_ELEMENTS
            or any(stride < 0 for stride in array.strides)):  # torch takes no negative strides
        return array.astype(dtype)
    out = np.empty(array.shape, dtype)  # C-ordered whatever the strides of ``array``
    _torch.from_numpy(out).copy_(_torch.from_numpy(array))
    return out


def round_to_half(array: np.ndarray) -> np.ndarray:
    """fp32 ``array`` rounded through fp16 (fp16 emulation), as a new fp32 array."""
    return cast(cast(array, np.float16), np.float32)


def conv2d_prepared(weight: np.ndarray, bias, strides, dilations, pads, groups: int) -> tuple | None:
    """What ``conv2d`` needs of a 2-D float32 convolution ``[F, C/groups, kH, kW]`` plus ``bias``
    [F] (``pads``: (before, after) per spatial dim), made once per op: its weight and bias as
    torch tensors (sharing the arrays' memory) and its geometry as torch's arguments; None when
    torch is not enabled or the arrays are not float32 ones of a 2-D conv. (Packing the weight
    for oneDNN once, through torch's internal mkldnn calls, measured no faster over a whole
    small conv net: its result comes channels last, and laying it out again costs what it saves.)"""
    if _torch is None or weight.ndim != 4 or weight.dtype != np.float32:
        return None
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32:
            return None
        bias = _torch.from_numpy(np.ascontiguousarray(bias.reshape(-1)))
    (top, bottom), (left, right) = pads
    pad_first = None
    if top != bottom or left != right:  # torch pads both sides alike: the input is padded first
        pad_first = (left, right, top, bottom)
        top = left = 0
    return (_torch.from_numpy(np.ascontiguousarray(weight)), bias, tuple(int(s) for s in strides), (top, left),
            tuple(int(d) for d in dilations), int(groups), pad_first)


def conv2d(inp: np.ndarray, prepared: tuple) -> np.ndarray | None:
    """The convolution ``prepared`` (``conv2d_prepared``) of a float32 ``[N, C, H, W]`` input,
    or None for another input."""
    if _torch is None or inp.ndim != 4 or inp.dtype != np.float32:
        return None
    weight, bias, strides, padding, dilations, groups, pad_first = prepared
    x = _torch.from_numpy(np.ascontiguousarray(inp))
    if pad_first is not None:
        x = _torch.nn.functional.pad(x, pad_first)
    return _torch.conv2d(x, weight, bias, strides, padding, dilations, groups).numpy()


def erf(value: np.ndarray) -> np.ndarray | None:
    """erf of a float32 array (float32, within an ulp or two of the float64 one), or None."""
    if _torch is None or value.dtype != np.float32:
        return None
    return _torch.erf(_torch.from_numpy(np.ascontiguousarray(value))).numpy()


_GELU_APPROXIMATIONS = {"none": "none", "tanh": "tanh"}


def gelu(value: np.ndarray, approximate: str) -> np.ndarray | None:
    """GELU of a float32 array (exact, ``"none"``, or the tanh approximation), or None."""
    if _torch is None or value.dtype != np.float32 or approximate not in _GELU_APPROXIMATIONS:
        return None
    x = _torch.from_numpy(np.ascontiguousarray(value))
    return _torch.nn.functional.gelu(x, approximate=_GELU_APPROXIMATIONS[approximate]).numpy()
