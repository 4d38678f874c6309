"""fp16 <-> fp32 casts by onnxruntime's vectorised conversion, where torch's kernels are not on.

numpy converts half floats one element at a time: an fp16 program's casts (every op widens its
fp16 operands and its result is cast back) took most of a small conv net's time in the build's
own process. onnxruntime, a dependency of this plugin that the validate stage has imported for its
reference already, converts them 10-20x faster, bit for bit as numpy does (IEEE round to nearest
even, both ways), on the caller's thread. Each direction is a one-node ``Cast`` model, its
session made at the first large cast.
"""

from __future__ import annotations

import threading

import numpy as np

#: elements below which numpy's cast is as fast (a session's run costs a few microseconds)
MIN_ELEMENTS = 8192

_FLOAT16, _FLOAT32 = np.dtype(np.float16), np.dtype(np.float32)
_sessions: dict = {}  # {(from dtype, to dtype): session, or None where onnxruntime is missing}
_lock = threading.Lock()


def cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``array`` (fp16 or fp32, C-ordered or channels last) as ``dtype`` (the other one): a new
    array of numpy's own in the same layout, or None for another pair, a small or otherwise laid
    out array, or without onnxruntime."""
    if array.size < MIN_ELEMENTS or {array.dtype, dtype} != {_FLOAT16, _FLOAT32}:
        return None
    if array.flags.c_contiguous:
        out = np.empty(array.shape, dtype)
        source, target = array, out
    elif array.ndim >= 3 and array.transpose(0, *range(2, array.ndim), 1).flags.c_contiguous:  # channels last
        out = np.empty_like(array, dtype)
        to_last = (0, *range(2, array.ndim), 1)
        source, target = array.transpose(to_last), out.transpose(to_last)
    else:
        return None
    session = _session(array.dtype, dtype)
    if session is None:
        return None
    binding = session.io_binding()
    binding.bind_cpu_input("x", source)
    binding.bind_output("y", "cpu", 0, dtype, list(target.shape), target.ctypes.data)  # written in place
    session.run_with_iobinding(binding)
    return out


def _session(source: np.dtype, target: np.dtype):
    key = (source, target)
    if key not in _sessions:
        with _lock:
            if key not in _sessions:
                _sessions[key] = _make_session(source, target)
    return _sessions[key]


def _make_session(source: np.dtype, target: np.dtype):
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    types = {_FLOAT16: TensorProto.FLOAT16, _FLOAT32: TensorProto.FLOAT}
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=types[target])], "cast",
                              [helper.make_tensor_value_info("x", types[source], None)],
                              [helper.make_tensor_value_info("y", types[target], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # the caller's thread: samples may run in several
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
