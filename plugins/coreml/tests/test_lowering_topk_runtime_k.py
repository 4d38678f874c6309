"""TopK whose ``k`` is computed at run time: MIL's topk takes ``k`` as a constant, so the lowering
sorts the whole axis and keeps its first ``k``.

The detection-head form is the reason: torchvision's SSD, RetinaNet and FCOS keep the scores above
a threshold (NonZero), then ``TopK(scores, Min(N, Shape(scores)[0]))``; the count is data, so no
pinned input shape makes ``k`` a constant. Each case runs in the MIL interpreter against
onnxruntime: values and indices, both directions, every axis of ranks 1 to 3, ``k`` from NonZero's
count, from a graph input, and clamped by the axis.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx_cases import IR_VERSION, assert_matches, lower_and_run, run_onnxruntime

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = oh.make_graph(nodes, "topk", inputs, [onnx.ValueInfoProto(name=n) for n in outputs], list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=IR_VERSION)


def _check(model, feeds):
    expected = run_onnxruntime(model, feeds)
    produced = lower_and_run(model, feeds)
    for name, value in expected.items():
        assert_matches(produced[name], value, rtol=0, atol=0, name=name)
    return expected


def _filtered_topk(limit: int, largest: int):
    """scores [N] -> the scores above 0.5 -> TopK(k = Min(limit, their count)), as torchvision writes it."""
    return _model([
        oh.make_node("Greater", ["scores", "threshold"], ["keep"]),
        oh.make_node("NonZero", ["keep"], ["where"]),
        oh.make_node("Transpose", ["where"], ["where_t"], perm=[1, 0]),
        oh.make_node("GatherND", ["scores", "where_t"], ["kept"]),
        oh.make_node("Shape", ["kept"], ["kept_shape"]),
        oh.make_node("Gather", ["kept_shape", "zero"], ["count"], axis=0),
        oh.make_node("Unsqueeze", ["count", "axis0"], ["count_1"]),
        oh.make_node("Concat", ["limit", "count_1"], ["both"], axis=0),
        oh.make_node("ReduceMin", ["both"], ["k_scalar"], keepdims=0),
        oh.make_node("Reshape", ["k_scalar", "one_dim"], ["k"]),
        oh.make_node("TopK", ["kept", "k"], ["values", "indices"], axis=0, largest=largest),
    ], [oh.make_tensor_value_info("scores", F, [64])], ["values", "indices"], [
        oh.make_tensor("threshold", F, [], [0.5]), oh.make_tensor("zero", I64, [], [0]),
        oh.make_tensor("axis0", I64, [1], [0]), oh.make_tensor("limit", I64, [1], [limit]),
        oh.make_tensor("one_dim", I64, [1], [1])])


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("limit, threshold_share", [(5, 0.5), (40, 0.5), (40, 0.0)],
                         ids=["limit-below-count", "count-below-limit", "nothing-kept"])
def test_k_from_the_count_nonzero_kept(limit, threshold_share, largest):
    scores = np.random.default_rng(limit).uniform(0.0, 1.0, 64).astype(np.float32)
    if threshold_share == 0.0:
        scores *= 0.4  # no score passes 0.5: k is 0 and both outputs are empty
    expected = _check(_filtered_topk(limit, largest), {"scores": scores})
    kept = int((scores > 0.5).sum())
    assert expected["values"].shape == (min(limit, kept),)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("shape, axis", [((9,), 0), ((4, 9), 1), ((4, 9), 0), ((3, 5, 7), 1), ((3, 5, 7), -1),
                                         ((3, 5, 7), 0)])
def test_k_as_run_time_data_on_every_axis(shape, axis, largest):
    model = _model([oh.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)],
                   [oh.make_tensor_value_info("x", F, list(shape)), oh.make_tensor_value_info("k", I64, [1])],
                   ["values", "indices"])
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    for k in (1, shape[axis] // 2, shape[axis]):
        expected = _check(model, {"x": x, "k": np.array([k], np.int64)})
        assert expected["values"].shape[axis] == k


def test_ties_keep_the_lower_index_first():
    """ONNX orders equal values by index; the whole-axis sort must too."""
    model = _model([oh.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1)],
                   [oh.make_tensor_value_info("x", F, [2, 8]), oh.make_tensor_value_info("k", I64, [1])],
                   ["values", "indices"])
    x = np.array([[1, 3, 3, 0, 3, 2, 2, 1], [0, 0, 0, 0, 1, 1, 0, 0]], np.float32)
    _check(model, {"x": x, "k": np.array([5], np.int64)})



def _sorting_loop(x_shape):
    """A Loop whose body sorts the outer x whole (k = Shape(x)[0]) at each of 3 trips: scan rows only, no
    loop-carried value (MIL's while_loop then returns its one variable alone)."""
    flag = onnx.TensorProto.BOOL
    body = oh.make_graph(
        [oh.make_node("Shape", ["x"], ["s"], start=0, end=1), oh.make_node("TopK", ["x", "s"], ["v", "i"]),
         oh.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [oh.make_tensor_value_info("iter", I64, []), oh.make_tensor_value_info("cond", flag, [])],
        [oh.make_tensor_value_info("cond_out", flag, []), oh.make_tensor_value_info("v", F, None)])
    return _model([oh.make_node("Loop", ["trips", ""], ["vs"], body=body, name="sorting")],
                  [oh.make_tensor_value_info("x", F, x_shape)], ["vs"], [oh.make_tensor("trips", I64, [], [3])])


def test_a_loop_of_scan_rows_only_lowers():
    _check(_sorting_loop([6]), {"x": np.random.default_rng(6).standard_normal(6).astype(np.float32)})


def test_scan_rows_as_long_as_a_flexible_dim_are_declined_by_name():
    from onnx_cases import lower

    from edgebuild_coreml.lowering.errors import DeclinedForm

    with pytest.raises(DeclinedForm, match="scan output 0 has rows of shape"):
        lower(_sorting_loop(["N"]))
