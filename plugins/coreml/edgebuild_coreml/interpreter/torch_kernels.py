"""Kernels PyTorch does several times faster than numpy, used where it is installed and the
interpreter validates an artifact (``enable``): fp16 <-> fp32 casts (numpy converts half floats
one element at a time, F16C or not, which made fp16 emulation cost more in casts than in
arithmetic), 2-D convolutions (all but small 1x1 ones) and matrix products by a weight through
oneDNN (twice OpenBLAS's speed on AVX-512), softmax, SiLU, and erf / exact GELU in float32 (the
numpy reference computes them in float64 series, most of a transformer's time).

The validate stage's samples in the build's own process turn them on for their own thread's
calls alone (``for_calls``), on one of torch's threads, once the process has torch (or the
samples on numpy's kernels have taken as long as importing it); worker processes turn them on
for good. Elsewhere (the fp16 guard, tests, a
machine without torch) the numpy kernels run, with onnxruntime's casts (``half_casts``); all give
the same casts bit for bit and the same convolutions and products up to summation order. Nothing
here runs a model: each function is one kernel on arrays the interpreter hands it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time

import numpy as np

from . import half_casts

_torch = None  # the torch module once enabled for good (``enable``)
_borrowed = None  # the torch module for the threads inside ``for_calls`` blocks, once this process has it
_thread = threading.local()  # .blocks: how many ``for_calls`` blocks this thread is inside


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


#: what importing torch costs a fresh process (1.5-2 s here): ``for_calls`` blocks run numpy's
#: kernels until they have taken as long, then import it (rent or buy: never worse than twice the
#: better choice); a small net's validation, ten times quicker than the import, never pays for it
TORCH_IMPORT_SECONDS = 1.5
_numpy_seconds = 0.0  # time ``for_calls`` blocks spent on numpy's kernels, torch not imported


def _imported_torch():
    """torch if this process has imported it completely already (a PyTorch source, a test), else
    None."""
    module = sys.modules.get("torch")
    spec = getattr(module, "__spec__", None)
    return None if module is None or getattr(spec, "_initializing", False) else module


def _torch_to_borrow():
    """torch once it is imported, or once the blocks on numpy's kernels have taken as long as
    importing it would (imported then); None before; False where it is not installed."""
    module = _imported_torch()
    if module is not None or _numpy_seconds < TORCH_IMPORT_SECONDS:
        return module
    try:
        import torch
    except ImportError:
        return False
    return torch


def _active():
    """The torch module where its kernels are on for the calling thread, else None."""
    if _torch is not None:
        return _torch
    return _borrowed if getattr(_thread, "blocks", 0) else None


def enabled() -> bool:
    return _active() is not None


_calls_lock = threading.Lock()
_calls = 0  # ``for_calls`` blocks running now, in every thread
_saved_threads = None  # torch's pool size before the first of them


@contextlib.contextmanager
def for_calls(threads: int = 1):
    """torch's kernels for the calls the calling thread makes inside the block, on ``threads`` of
    torch's intra-op pool, where this process has imported torch or the blocks before have run
    long enough to pay for importing it (``TORCH_IMPORT_SECONDS``), and its kernels are not on for
    good already (a worker process has them on): the build's own process runs validation
    samples in one thread while another may run the reference, as its BLAS calls do (``map_samples``). Other threads keep
    numpy's kernels meanwhile (the fp16 guard of another build's stage decides by its errors, which
    must not depend on when a validation runs), and torch's pool size comes back when the last
    block ends (a PyTorch source's reference keeps its own pool). A pool of more threads than the
    cores left free spins: on a busy 2-core machine two threads ran a small conv net six times
    slower than one."""
    global _calls, _saved_threads, _borrowed, _numpy_seconds
    if _torch is not None:  # on for good here
        yield
        return
    with _calls_lock:
        if _borrowed is None:
            _borrowed = _torch_to_borrow()
        turned_on = bool(_borrowed)
        if turned_on:
            if _calls == 0:
                _saved_threads = _borrowed.get_num_threads()
                _borrowed.set_num_threads(threads)
            _calls += 1
    if not turned_on:
        started = time.perf_counter()
        try:
            yield
        finally:
            with _calls_lock:
                _numpy_seconds += time.perf_counter() - started
        return
    _thread.blocks = getattr(_thread, "blocks", 0) + 1
    try:
        yield
    finally:
        _thread.blocks -= 1
        with _calls_lock:
            _calls -= 1
            if _calls == 0:
                _borrowed.set_num_threads(_saved_threads)


_HALF_PAIRS = {(np.dtype(np.float16), np.dtype(np.float32)), (np.dtype(np.float32), np.dtype(np.float16))}
MIN_CAST_ELEMENTS = 4096  # below this numpy's per-call cost is the lower one


def cast(array: np.ndarray, dtype) -> np.ndarray:
    """``array.astype(dtype)`` (a new array of numpy's own, so later ops may overwrite it),
    through torch for fp16 <-> fp32 when enabled, else through onnxruntime's (``half_casts``)."""
    dtype, torch = np.dtype(dtype), _active()
    if torch is None and (array.dtype, dtype) in _HALF_PAIRS:
        converted = half_casts.cast(array, dtype)
        return array.astype(dtype) if converted is None else converted
    if (torch is None or (array.dtype, dtype) not in _HALF_PAIRS or array.size < MIN_CAST_ELEMENTS
            or any(stride < 0 for stride in array.strides)):  # torch takes no negative strides
        return array.astype(dtype)
    # in ``array``'s own layout where it is a dense one (channels last stays so: no transposing
    # copy), else C-ordered
    out = np.empty_like(array, dtype) if channels_last(array) else np.empty(array.shape, dtype)
    torch.from_numpy(out).copy_(torch.from_numpy(array))
    return out


_HALF_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "real_div": "div", "maximum": "maximum", "minimum": "minimum"}


def half_binary(op_type: str, a, b) -> np.ndarray | None:
    """MIL ``op_type`` (add, sub, mul, real_div, maximum, minimum) of two fp16 arrays as an fp16
    array, or None (not enabled, another operand, a small one). torch computes each element in
    fp32 and rounds it once to fp16, as numpy's widened operands and the executor's cast of the
    result do, bit for bit, without the three casts: an fp16 program's activations are
    multiplied and added in fp16 all along. The result keeps the operands' layout."""
    torch = _active()
    if (torch is None or op_type not in _HALF_BINARY or not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray)
            or a.dtype != np.float16 or b.dtype != np.float16 or max(a.size, b.size) < MIN_CAST_ELEMENTS
            or any(stride < 0 for stride in a.strides + b.strides)):
        return None
    return getattr(torch, _HALF_BINARY[op_type])(torch.from_numpy(a), torch.from_numpy(b)).numpy()




#: activations oneDNN applies to a convolution's result as it writes it (``conv2d_prepared``):
#: {name: oneDNN's name}; its hard-swish is ``x * min(max(x / 6 + 1 / 2, 0), 1)``
FUSED_ACTIVATIONS = {"relu": "relu", "hard_swish": "hardswish"}


def fuses_activations() -> bool:
    """Whether ``conv2d_prepared`` takes an ``activation``: torch enabled, with its oneDNN
    convolution that applies one."""
    return _active() is not None and _pointwise_convolution() is not None


@functools.cache
def _pointwise_convolution():
    import torch

    mkldnn = getattr(torch.ops, "mkldnn", None)
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

    Every conv computes channels last: oneDNN's NCHW path reorders its input and output on every
    call, twice a small map's time, and its channels-last result stays so for the ops after it
    (``channels_last``), so of a conv net only the first conv lays out its input. The weight is
    also packed for oneDNN once, for inputs of ``input_shape``: torch otherwise reorders it on
    every call, a third of a small map's time. (With the 1x1 convs left to numpy's matrix
    products, packing the others measured no faster: their channels-last results were laid out
    again for those; one oneDNN layout all along ran MobileNet's convs 2.5x faster.)"""
    torch = _active()
    if torch is None or weight.ndim != 4 or weight.dtype != np.float32:
        return None
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32:
            return None
        bias = torch.from_numpy(np.ascontiguousarray(bias.reshape(-1)))
    (top, bottom), (left, right) = pads
    pad_first = None
    if top != bottom or left != right:  # torch pads both sides alike: the input is padded first
        pad_first = (left, right, top, bottom)
        top = left = 0
    torch_weight = torch.from_numpy(np.ascontiguousarray(weight)).contiguous(memory_format=torch.channels_last)
    post_op = None if activation is None else FUSED_ACTIVATIONS[activation]
    strides, padding, dilations = tuple(int(s) for s in strides), (top, left), tuple(int(d) for d in dilations)
    packed = None
    if input_shape is not None:
        padded = tuple(input_shape) if pad_first is None else (
            *input_shape[:2], input_shape[2] + pad_first[2] + pad_first[3], input_shape[3] + pad_first[0] + pad_first[1])
        packed = _packed_weight(torch_weight, padding, strides, dilations, int(groups), padded)
    return (torch_weight, bias, strides, padding, dilations, int(groups), pad_first, post_op, packed)


def _packed_weight(weight, padding, strides, dilations, groups: int, input_shape: tuple):
    """``(input shape, weight in oneDNN's own layout for that input)``, or None where torch has no
    oneDNN convolution to take it."""
    if _pointwise_convolution() is None:
        return None
    try:
        import torch

        reordered = torch.ops.mkldnn._reorder_convolution_weight(weight, list(padding), list(strides), list(dilations),
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
    (in C order or channels last), or None for another input. The result is channels last."""
    torch = _active()
    if torch is None or inp.ndim != 4 or inp.dtype != np.float32:
        return None
    weight, bias, strides, padding, dilations, groups, pad_first, post_op, packed = prepared
    laid_last = channels_last(inp)
    x = torch.from_numpy(inp if inp.flags.c_contiguous or laid_last else np.ascontiguousarray(inp))
    if not laid_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if pad_first is not None:
        x = torch.nn.functional.pad(x, pad_first)
    convolution = _pointwise_convolution()
    if packed is not None and packed[0] == tuple(x.shape):
        return convolution(x, packed[1], bias, padding, strides, dilations, groups, post_op or "none", [], "").numpy()
    if post_op is not None:
        return convolution(x, weight, bias, padding, strides, dilations, groups, post_op, [], "").numpy()
    return torch.conv2d(x, weight, bias, strides, padding, dilations, groups).numpy()


def erf(value: np.ndarray) -> np.ndarray | None:
    """erf of a float32 array (float32, within an ulp or two of the float64 one), or None."""
    torch = _active()
    if torch is None or value.dtype != np.float32:
        return None
    return torch.erf(torch.from_numpy(np.ascontiguousarray(value))).numpy()


_GELU_APPROXIMATIONS = {"none": "none", "tanh": "tanh"}


def gelu(value: np.ndarray, approximate: str) -> np.ndarray | None:
    """GELU of a float32 array (exact, ``"none"``, or the tanh approximation), or None."""
    torch = _active()
    if torch is None or value.dtype != np.float32 or approximate not in _GELU_APPROXIMATIONS:
        return None
    x = torch.from_numpy(np.ascontiguousarray(value))
    return torch.nn.functional.gelu(x, approximate=_GELU_APPROXIMATIONS[approximate]).numpy()


@functools.cache
def _pointwise_linear():
    import torch

    try:  # oneDNN's matrix product: twice OpenBLAS's speed on a transformer's shapes (AVX-512)
        return torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return None


#: multiply-adds of a ``linear`` below which numpy's product is as fast as oneDNN's call
MIN_LINEAR_MACS = 1 << 18


def linear(value: np.ndarray, weight: np.ndarray, bias) -> np.ndarray | None:
    """``value @ weight.T + bias`` of a float32 ``[..., K]`` input, ``[N, K]`` weight (in any
    layout: a ``[K, N]`` matrix's transposed view is read as it lies) and ``[N]`` bias (or None) by
    oneDNN, or None (not enabled, other types or ranks, a small product)."""
    torch = _active()
    if (torch is None or not isinstance(value, np.ndarray) or not isinstance(weight, np.ndarray)
            or value.dtype != np.float32 or weight.dtype != np.float32 or weight.ndim != 2
            or value.ndim < 2 or value.shape[-1] != weight.shape[1]
            or value.size * weight.shape[0] < MIN_LINEAR_MACS or any(s < 0 for s in value.strides + weight.strides)):
        return None
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32 or bias.shape != (weight.shape[0],):
            return None
    product = _pointwise_linear()
    if product is None:
        return None
    x = torch.from_numpy(np.ascontiguousarray(value))
    w = torch.from_numpy(weight)
    return product(x, w, None if bias is None else torch.from_numpy(bias), "none", [], "").numpy()


def softmax(value: np.ndarray, axis: int) -> np.ndarray | None:
    """softmax of a float32 array along ``axis`` (torch's, within an ulp or two of numpy's), or None."""
    torch = _active()
    if torch is None or value.dtype != np.float32 or value.ndim == 0 or value.size < MIN_CAST_ELEMENTS:
        return None
    return torch.softmax(torch.from_numpy(np.ascontiguousarray(value)), axis).numpy()


def silu(value: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
    """``x * sigmoid(x)`` of a float32 array (in its own layout), written into ``out`` when it is
    ``value`` itself (an input nobody else holds), or None (not enabled, another type, a small
    array, another ``out``): numpy's exp costs a YOLO-style net's activations a third of its time."""
    torch = _active()
    if (torch is None or not isinstance(value, np.ndarray) or value.dtype != np.float32
            or value.size < MIN_CAST_ELEMENTS or (out is not None and out is not value)
            or any(s < 0 for s in value.strides)):
        return None
    x = torch.from_numpy(value)
    if out is not None and value.flags.writeable:
        torch.nn.functional.silu(x, inplace=True)
        return value
    return torch.nn.functional.silu(x).numpy()
