"""Convolutions by onnxruntime's CPU kernels (MLAS, blocked channels), for the validate stage's
samples in the build's own process (``for_calls``), where torch's kernels are not on.

onnxruntime is already this plugin's dependency and, for an ONNX source, already imported as the
validation's reference; a session of one ``Conv`` node per op and input shape costs about half a
millisecond to make and runs a depthwise or dense conv 3-6x faster than the numpy kernels (which
copy every tap into a matrix first): on a MobileNet-style classifier, most of a sample's time.

Only the calls inside a block take them: the validate stage's, and the fp16 guard's, which opens
its own, so what it keeps in fp32 (chosen by measured errors) never depends on which kernels
another thread's validation ran; tests and every other caller keep the numpy kernels. A conv
whose weight is computed at run time keeps them too (a session a run). The session's weights are the
plan's own arrays, handed over in memory (``add_external_initializers``: no copy in the model's
bytes; onnxruntime's blocked layout is its one copy of them); the op's activation is applied by
the caller, as on numpy's path.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence

import numpy as np

_thread = threading.local()  # .blocks: how many ``for_calls`` blocks this thread is inside


@contextlib.contextmanager
def for_calls():
    """onnxruntime's convolutions for the calls the calling thread makes inside the block."""
    _thread.blocks = getattr(_thread, "blocks", 0) + 1
    try:
        yield
    finally:
        _thread.blocks -= 1


def active() -> bool:
    """Whether the calling thread is inside a ``for_calls`` block and onnxruntime is installed."""
    return bool(getattr(_thread, "blocks", 0)) and _onnxruntime() is not None


@functools.cache
def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def _external(name: str, array: np.ndarray):
    """An initializer whose data the session is handed in memory (``add_external_initializers``)
    rather than copied into the model's bytes."""
    from onnx import TensorProto

    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape,
                         data_location=TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value=f"{name}.in-memory")
    return tensor


#: spatial ranks onnxruntime's CPU ``Conv`` computes
SPATIAL_RANKS = (1, 2, 3)


def conv_call(in_shape: Sequence[int], weight: np.ndarray, bias, strides, dilations, groups: int,
              pads) -> Callable[[np.ndarray], np.ndarray] | None:
    """``value -> conv(value)`` (a fresh float32 array) for float32 inputs of ``in_shape``, by a
    session of one ``Conv`` node; ``pads``: (before, after) per spatial dim. None where this
    geometry is not onnxruntime's to compute (another rank or type, an empty tensor) or it
    declines to make the session: numpy's kernels compute it then."""
    ort = _onnxruntime()
    if (ort is None or len(in_shape) - 2 not in SPATIAL_RANKS or weight.dtype != np.float32
            or not all(in_shape) or not weight.size):
        return None
    from onnx import TensorProto, helper

    weight = np.ascontiguousarray(weight)
    inputs, initializers = ["x", "w"], {"w": weight}
    if bias is not None:
        initializers["b"] = np.ascontiguousarray(np.asarray(bias, np.float32).reshape(-1))
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], strides=[int(s) for s in strides],
                            dilations=[int(d) for d in dilations], group=int(groups),
                            pads=[int(b) for b, _ in pads] + [int(a) for _, a in pads])
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_external(name, array) for name, array in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # a reference may run beside it
    options.log_severity_level = 3
    values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in initializers.items()}
    options.add_external_initializers(list(values), list(values.values()))
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's own error types: a geometry it declines is numpy's to compute
        return None
    run = session.run

    def call(value: np.ndarray) -> np.ndarray:
        return run(None, {"x": np.ascontiguousarray(value)})[0]

    call.kept = (session, values, initializers)  # the initializers' memory outlives the session
    return call
