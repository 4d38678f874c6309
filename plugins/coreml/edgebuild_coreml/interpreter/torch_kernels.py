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

import time

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
            or not array.flags.c_contiguous):
        return array.astype(dtype)
    out = np.empty(array.shape, dtype)
    _torch.from_numpy(out).copy_(_torch.from_numpy(array))
    return out


def round_to_half(array: np.ndarray) -> np.ndarray:
    """fp32 ``array`` rounded through fp16 (fp16 emulation), as a new fp32 array."""
    return cast(cast(array, np.float16), np.float32)


def conv2d_prepared(weight: np.ndarray, bias, strides, dilations, pads, groups: int, in_shape) -> tuple | None:
    """What ``conv2d`` needs of a 2-D float32 convolution ``[F, C/groups, kH, kW]`` plus ``bias``
    [F] (``pads``: (before, after) per spatial dim) on inputs of ``in_shape``, made once per op:
    its weight and bias as torch tensors (sharing the arrays' memory), its geometry as torch's
    arguments and, where oneDNN takes them, its weight packed in oneDNN's layout; None when torch
    is not enabled or the arrays are not float32 ones of a 2-D conv."""
    if _torch is None or weight.ndim != 4 or weight.dtype != np.float32 or len(in_shape) != 4:
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
        in_shape = (*in_shape[:2], in_shape[2] + top + bottom, in_shape[3] + left + right)
        top = left = 0
    plain = (_torch.from_numpy(np.ascontiguousarray(weight)), bias, tuple(int(s) for s in strides), (top, left),
             tuple(int(d) for d in dilations), int(groups))
    return (*plain, pad_first, _packed(plain, tuple(int(d) for d in in_shape)))


def _packed(plain: tuple, in_shape: tuple):
    """``plain``'s weight packed for oneDNN (``mkldnn``) when that computes the conv faster, else
    None. torch's own conv2d reorders the weight and sets up oneDNN's convolution on every call:
    on a small map that is most of its time (a depthwise 5x5 on 88x3x96 took 85 us, 65 us packed),
    while on large maps the packed call measured slower (a depthwise 3x3 on 32x112x112: 340 us
    against 155 us), with no simple rule between; so both are timed here, once per op, on a
    probe input. The packed call is torch's internal one, so its result is checked against the
    plain one's first: either gives the same conv, only the time differs."""
    weight, bias, strides, padding, dilations, groups = plain
    try:
        if not _torch.backends.mkldnn.is_available():
            return None
        packed = _torch._C._nn.mkldnn_reorder_conv2d_weight(weight.to_mkldnn(), list(padding), list(strides),
                                                             list(dilations), groups, list(in_shape))
        probe = _torch.from_numpy(np.random.default_rng(0).standard_normal(in_shape, np.float32))
        fast = _packed_conv(probe, packed, bias, padding, strides, dilations, groups)
    except Exception:  # noqa: BLE001 - a torch without (this form of) the internal call: the plain one
        return None
    plain_result = _torch.conv2d(probe, weight, bias, strides, padding, dilations, groups)
    if fast.shape != plain_result.shape or not _torch.allclose(fast, plain_result, rtol=1e-4, atol=1e-4):
        return None
    packed_seconds, plain_seconds = [], []
    for _ in range(PACKING_TRIALS):  # alternated, the least of each: the machine may be busy
        packed_seconds.append(_seconds(lambda: _packed_conv(probe, packed, bias, padding, strides, dilations, groups)))
        plain_seconds.append(_seconds(lambda: _torch.conv2d(probe, weight, bias, strides, padding, dilations, groups)))
    return packed if min(packed_seconds) < min(plain_seconds) else None


PACKING_TRIALS = 3


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _packed_conv(x, packed, bias, padding, strides, dilations, groups):
    return _torch.ops.mkldnn._convolution_pointwise(x, packed, bias, list(padding), list(strides), list(dilations),
                                                    groups, "none", [], "")


def conv2d(inp: np.ndarray, prepared: tuple) -> np.ndarray | None:
    """The convolution ``prepared`` (``conv2d_prepared``) of a float32 ``[N, C, H, W]`` input of
    the shape it was prepared for, or None for another input."""
    if _torch is None or inp.ndim != 4 or inp.dtype != np.float32:
        return None
    weight, bias, strides, padding, dilations, groups, pad_first, packed = prepared
    x = _torch.from_numpy(np.ascontiguousarray(inp))
    if pad_first is not None:
        x = _torch.nn.functional.pad(x, pad_first)
    if packed is not None:
        return _packed_conv(x, packed, bias, padding, strides, dilations, groups).numpy()
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
