"""Kernels PyTorch does several times faster than numpy, used where it is installed and the
interpreter validates an artifact (``enable``): fp16 <-> fp32 casts (numpy converts half floats
one element at a time, F16C or not, which made fp16 emulation cost more in casts than in
arithmetic), 2-D convolutions that are not one matrix product (depthwise, strided, k x k) and
erf / exact GELU in float32 (the numpy reference computes them in float64 series, most of a
transformer's time).

Elsewhere (the build's own process, the fp16 guard, tests, a machine without torch) the numpy
kernels run, with onnxruntime's casts (``half_casts``); all give the same casts bit for bit and
the same convolutions up to summation order. Nothing here runs a model: each function is one
kernel on arrays the interpreter hands it.
"""

from __future__ import annotations

import functools

import numpy as np

from . import half_casts

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
    through torch for fp16 <-> fp32 when enabled, else through onnxruntime's (``half_casts``)."""
    dtype = np.dtype(dtype)
    if _torch is None and (array.dtype, dtype) in _HALF_PAIRS:
        converted = half_casts.cast(array, dtype)
        return array.astype(dtype) if converted is None else converted
    if (_torch is None or (array.dtype, dtype) not in _HALF_PAIRS or array.size < MIN_CAST_ELEMENTS
            or any(stride < 0 for stride in array.strides)):  # torch takes no negative strides
        return array.astype(dtype)
    # in ``array``'s own layout where it is a dense one (channels last stays so: no transposing
    # copy), else C-ordered
    out = np.empty_like(array, dtype) if channels_last(array) else np.empty(array.shape, dtype)
    _torch.from_numpy(out).copy_(_torch.from_numpy(array))
    return out


_HALF_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "real_div": "div", "maximum": "maximum", "minimum": "minimum"}


def half_binary(op_type: str, a, b) -> np.ndarray | None:
    """MIL ``op_type`` (add, sub, mul, real_div, maximum, minimum) of two fp16 arrays as an fp16
    array, or None (not enabled, another operand, a small one). torch computes each element in
    fp32 and rounds it once to fp16, as numpy's widened operands and the executor's cast of the
    result do, bit for bit, without the three casts: an fp16 program's activations are
    multiplied and added in fp16 all along. The result keeps the operands' layout."""
    if (_torch is None or op_type not in _HALF_BINARY or not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray)
            or a.dtype != np.float16 or b.dtype != np.float16 or max(a.size, b.size) < MIN_CAST_ELEMENTS
            or any(stride < 0 for stride in a.strides + b.strides)):
        return None
    return getattr(_torch, _HALF_BINARY[op_type])(_torch.from_numpy(a), _torch.from_numpy(b)).numpy()


def round_to_half(array: np.ndarray) -> np.ndarray:
    """fp32 ``array`` rounded through fp16 (fp16 emulation), as a new fp32 array."""
    return cast(cast(array, np.float16), np.float32)


#: activations oneDNN applies to a convolution's result as it writes it (``conv2d_prepared``):
#: {name: oneDNN's name}; its hard-swish is ``x * min(max(x / 6 + 1 / 2, 0), 1)``
FUSED_ACTIVATIONS = {"relu": "relu", "hard_swish": "hardswish"}


def fuses_activations() -> bool:
    """Whether ``conv2d_prepared`` takes an ``activation``: torch enabled, with its oneDNN
    convolution that applies one."""
    return _torch is not None and _pointwise_convolution() is not None


@functools.cache
def _pointwise_convolution():
    mkldnn = getattr(_torch.ops, "mkldnn", None)
    try:  # its one overload, called directly: the overload packet's dispatch is a Python call more
        return None if mkldnn is None else mkldnn._convolution_pointwise.default
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return None


def conv2d_prepared(weight: np.ndarray, bias, strides, dilations, pads, groups: int,
                    activation: str | None = None, input_shape: tuple | None = None) -> tuple | None:
    """What ``conv2d`` needs of a 2-D float32 convolution ``[F, C/groups, kH, kW]`` plus ``bias``
    [F] (``pads``: (before, after) per spatial dim), then ``activation`` (a key of
    ``FUSED_ACTIVATIONS``, where ``fuses_activations()``), made once per op: its weight and bias as
    torch tensors (sharing the arrays' memory) and its geometry as torch's arguments; None when
    torch is not enabled or the arrays are not float32 ones of a 2-D conv.

    A depthwise conv's weight is also packed for oneDNN once, for inputs of ``input_shape``:
    torch otherwise reorders it on every call, a third of a small map's time. (Packing any other
    conv's measured no faster over a whole small conv net: its result then comes channels last,
    and laying it out again costs what the packing saves.)"""
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
    torch_weight = _torch.from_numpy(np.ascontiguousarray(weight))
    depthwise = groups > 1 and groups == weight.shape[0] and weight.shape[1] == 1
    if depthwise:
        # a depthwise conv computes channels last: oneDNN's NCHW path reorders its input and
        # output every call, twice the time on a small map. Its result stays channels last for
        # the ops after it (``channels_last``), so of a chain only the first conv lays out its input
        torch_weight = torch_weight.contiguous(memory_format=_torch.channels_last)
    post_op = None if activation is None else FUSED_ACTIVATIONS[activation]
    strides, padding, dilations = tuple(int(s) for s in strides), (top, left), tuple(int(d) for d in dilations)
    packed = None
    if depthwise and input_shape is not None:
        padded = tuple(input_shape) if pad_first is None else (
            *input_shape[:2], input_shape[2] + pad_first[2] + pad_first[3], input_shape[3] + pad_first[0] + pad_first[1])
        packed = _packed_weight(torch_weight, padding, strides, dilations, int(groups), padded)
    return (torch_weight, bias, strides, padding, dilations, int(groups), pad_first, depthwise, post_op, packed)


def _packed_weight(weight, padding, strides, dilations, groups: int, input_shape: tuple):
    """``(input shape, weight in oneDNN's own layout for that input)``, or None where torch has no
    oneDNN convolution to take it."""
    if _pointwise_convolution() is None:
        return None
    try:
        reordered = _torch.ops.mkldnn._reorder_convolution_weight(weight, list(padding), list(strides), list(dilations),
                                                                   groups, list(input_shape))
    except (AttributeError, RuntimeError):  # a torch without the call, or a geometry oneDNN refuses
        return None
    return tuple(input_shape), reordered


def channels_last(array: np.ndarray) -> bool:
    """Whether ``array`` ``[N, C, *spatial]`` is laid out ``[N, *spatial, C]`` (and not also in C
    order, as one of a single pixel or channel is): what a depthwise conv's torch result and the
    ops reading it keep, as numpy's elementwise ops keep their operands' layout."""
    if array.ndim != 4:
        return (array.ndim >= 3 and not array.flags.c_contiguous
                and array.transpose(0, *range(2, array.ndim), 1).flags.c_contiguous)
    if array.flags.c_contiguous:
        return False
    # [N, C, H, W] by its strides (a transposed view and its flags cost a conv net's many small
    # ops more): each dim's stride is the bytes of the dims inside it, ignored where it is 1 long
    n, c, h, w = array.shape
    sn, sc, sh, sw = array.strides
    step = array.itemsize
    return ((c == 1 or sc == step) and (w == 1 or sw == step * c) and (h == 1 or sh == step * c * w)
            and (n == 1 or sn == step * c * w * h))


def conv2d(inp: np.ndarray, prepared: tuple) -> np.ndarray | None:
    """The convolution ``prepared`` (``conv2d_prepared``) of a float32 ``[N, C, H, W]`` input
    (in C order or channels last), or None for another input. The result is channels last where
    torch computed it so (a depthwise conv, or any conv of a channels-last input)."""
    if _torch is None or inp.ndim != 4 or inp.dtype != np.float32:
        return None
    weight, bias, strides, padding, dilations, groups, pad_first, depthwise, post_op, packed = prepared
    laid_last = channels_last(inp)
    x = _torch.from_numpy(inp if inp.flags.c_contiguous or laid_last else np.ascontiguousarray(inp))
    if depthwise and not laid_last:
        x = x.contiguous(memory_format=_torch.channels_last)
    if pad_first is not None:
        x = _torch.nn.functional.pad(x, pad_first)
    if packed is not None and packed[0] == tuple(x.shape):
        return _pointwise_convolution()(x, packed[1], bias, padding, strides, dilations, groups, post_op or "none",
                                        [], "").numpy()
    if post_op is not None:
        return _pointwise_convolution()(x, weight, bias, padding, strides, dilations, groups, post_op, [], "").numpy()
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
