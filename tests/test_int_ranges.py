"""The saturate_discarded_int64 pass: int64 constants outside int32 that every reader selects or clamps
away are saturated, and the graph computes the same; any other reader keeps them, with the reason.

Each case is a small graph of one pattern (the forms exported models take: T5's relative-position
buckets, INT64_MAX picked away by Where, clamped by Min/Max/Clip, Slice bounds), run by onnx's
reference evaluator before and after the pass on the same inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

from edgebuild.graph.int_ranges import INT_RANGE, int_range_reason, saturate_graph
from edgebuild.registry import get_registry

I64, F32, BOOL = onnx.TensorProto.INT64, onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL
INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
INT32_MIN, INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max
N = 6


def _const(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(values, dtype), name)


def _model(nodes, inputs, outputs, initializers=(), opset: int = 18) -> ir.Model:
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(initializers))
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    proto = onnx.shape_inference.infer_shapes(proto)
    return ir.serde.deserialize_model(proto)


def _run(model: ir.Model, feeds: dict) -> list[np.ndarray]:
    with np.errstate(all="ignore"):  # Log(0), casts of -inf: what the graphs compute on purpose
        return ReferenceEvaluator(ir.serde.serialize_model(model)).run(None, feeds)


def _apply(model: ir.Model, feeds: dict, bits: int = 32) -> tuple[list, dict]:
    """Saturate ``model``; check it computes what it did before on ``feeds``; the names saturated and kept."""
    before = _run(model, feeds)
    saturated, kept = saturate_graph(model.graph, bits)
    after = _run(model, feeds)
    for old, new in zip(before, after):
        assert old.dtype == new.dtype and np.array_equal(old, new, equal_nan=True)
    return [value.name for value in saturated], kept


def _in_range(model: ir.Model, bits: int = 32) -> bool:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return all(low <= value.const_value.numpy().min() and value.const_value.numpy().max() <= high
               for value in model.graph.initializers.values() if value.const_value.dtype.is_integer())


def _t5_buckets(exact: int = 3, buckets: int = 8):
    """T5's ``_relative_position_bucket`` after pinned shapes folded its constant part:
    ``Where(|rel| < exact, |rel|, Min(exact + Cast(Log(|rel| / exact) * ...), buckets - 1))``, where
    ``Log(0) = -inf`` cast to int64 left INT64_MIN; the Min's other operand, a ConstantOfShape, stays."""
    rel = np.abs(np.arange(N)[None, :] - np.arange(N)[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        large = exact + (np.log(rel / exact) / np.log(16 / exact) * (buckets - exact)).astype(np.int64)
    assert large.min() == INT64_MIN + exact
    nodes = [
        oh.make_node("Shape", ["positions"], ["shape"]),
        oh.make_node("ConstantOfShape", ["shape"], ["last"], value=_const("v", [buckets - 1])),
        oh.make_node("Min", ["large", "last"], ["clamped"]),
        oh.make_node("Where", ["is_small", "rel", "clamped"], ["bucket"]),
        oh.make_node("Add", ["bucket", "positions"], ["shifted"]),
        oh.make_node("Gather", ["table", "shifted"], ["bias"]),
    ]
    initializers = [_const("large", large), _const("rel", rel), _const("is_small", rel < exact, np.bool_),
                    onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((2 * buckets, 4))
                                                 .astype(np.float32), "table")]
    model = _model(nodes, [oh.make_tensor_value_info("positions", I64, [N, N])],
                   [oh.make_tensor_value_info("bias", F32, [N, N, 4])], initializers)
    return model, {"positions": np.random.default_rng(1).integers(0, buckets, (N, N))}


def test_t5_relative_position_buckets_are_saturated():
    model, feeds = _t5_buckets()
    saturated, kept = _apply(model, feeds)
    assert saturated == ["large"] and not kept
    assert _in_range(model)


def _graph(nodes, initializers, *, shape=(N,), x_dtype=I64, out=("y", I64), extra_inputs=()):
    inputs = [oh.make_tensor_value_info("x", x_dtype, list(shape)), *extra_inputs]
    return _model(nodes, inputs, [oh.make_tensor_value_info(out[0], out[1], None)], initializers)


def _feeds(shape=(N,), low=-100, high=100, seed=0, **more):
    return {"x": np.random.default_rng(seed).integers(low, high, shape), **more}


def _sentinels(sentinel, shape=(N,)):
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    values[..., 1::2] = sentinel
    return _const("c", values)


# (pattern, nodes after the sentinel constant ``c`` and a run-time ``x``, sentinel): each leaves y the same
SATURATED = {
    # clamped to one value in both: the bound lies beyond both the sentinel and its saturated value
    "min_int64_max": ([oh.make_node("Min", ["c", "x"], ["y"])], INT64_MAX),
    "max_int64_min": ([oh.make_node("Max", ["x", "c"], ["y"])], INT64_MIN),
    "max_zero_of_min_sentinel": ([oh.make_node("Max", ["c", "zero"], ["m"]), oh.make_node("Add", ["m", "x"], ["y"])],
                                 INT64_MIN),
    "clip_lower_bound": ([oh.make_node("Clip", ["x", "c_scalar", "hundred"], ["y"])], INT64_MIN),
    "clip_upper_bound": ([oh.make_node("Clip", ["x", "minus", "c_scalar"], ["y"])], INT64_MAX),
    # selected away: the condition is known where the sentinel is
    "where_selects_other": ([oh.make_node("Where", ["odd_false", "c", "x"], ["y"])], INT64_MAX),
    "where_then_min": ([oh.make_node("Greater", ["x", "zero"], ["positive"]),
                        oh.make_node("Where", ["positive", "x", "c"], ["w"]),
                        oh.make_node("Shape", ["x"], ["s"]),
                        oh.make_node("ConstantOfShape", ["s"], ["limit"], value=_const("v", [1000])),
                        oh.make_node("Min", ["w", "limit"], ["y"])], INT64_MAX),
    # a comparison or a Cast to bool decided alike in both (the backend's x is an int32: at or above -2**31)
    "less_decided": ([oh.make_node("LessOrEqual", ["c", "x"], ["b"]), oh.make_node("Where", ["b", "x", "zero"], ["y"])],
                     INT64_MIN),
    "cast_to_bool": ([oh.make_node("Cast", ["c"], ["b"], to=BOOL), oh.make_node("Where", ["b", "x", "zero"], ["y"])],
                     INT64_MAX),
    # moved first (reshaped, transposed, concatenated, gathered with constant indices), then selected away
    "moved_then_selected": ([oh.make_node("Unsqueeze", ["c", "axis0"], ["u"]),
                             oh.make_node("Concat", ["u", "u"], ["two"], axis=0),
                             oh.make_node("Transpose", ["two"], ["t"], perm=[1, 0]),
                             oh.make_node("Gather", ["t", "first"], ["g"], axis=1),
                             oh.make_node("Reshape", ["g", "flat"], ["r"]),
                             oh.make_node("Where", ["odd_false", "r", "x"], ["y"])], INT64_MIN),
    # Slice clamps its bounds to the dimension
    "slice_end": ([oh.make_node("Slice", ["x", "one", "c_scalar"], ["y"])], INT64_MAX),
    "slice_reverse_to_start": ([oh.make_node("Slice", ["x", "minus_one", "c_scalar", "zero_1", "minus_one"], ["y"])],
                               INT64_MIN),
}

_HELPERS = [
    _const("zero", 0), _const("hundred", 100), _const("minus", -100), _const("one", [1]), _const("minus_one", [-1]),
    _const("zero_1", [0]), _const("axis0", [0]), _const("first", 0), _const("flat", [N]),
    _const("odd_false", np.arange(N) % 2 == 0, np.bool_),
]


@pytest.mark.parametrize("case", sorted(SATURATED))
def test_discarded_sentinels_are_saturated(case):
    nodes, sentinel = SATURATED[case]
    constants = [_sentinels(sentinel), _const("c_scalar", [sentinel] if "slice" in case else sentinel)]
    used = {name for node in nodes for name in node.input}
    model = _graph(nodes, [c for c in constants + _HELPERS if c.name in used])
    saturated, kept = _apply(model, _feeds())
    assert saturated and not kept, kept
    assert _in_range(model)


# (pattern, nodes, sentinel, words the reason must hold): y would change, or no rule can show it does not
KEPT = {
    # Min with 15 keeps -2**63 in the source but -2**31 saturated: not the same value
    "min_keeps_it": ([oh.make_node("Min", ["c", "fifteen"], ["m"]), oh.make_node("Add", ["m", "x"], ["y"])],
                     INT64_MIN, "graph output 'y'"),
    "graph_output": ([oh.make_node("Add", ["c", "x"], ["y"])], INT64_MIN, "graph output 'y'"),
    # a condition only the run-time input decides: the sentinel may reach the reader
    "gather_indices": ([oh.make_node("Greater", ["x", "hundred"], ["b"]), oh.make_node("Where", ["b", "c", "x"], ["i"]),
                        oh.make_node("Gather", ["x", "i"], ["y"])], INT64_MAX, "(Gather) takes them as its indices"),
    "cast_to_float": ([oh.make_node("Cast", ["c"], ["f"], to=F32), oh.make_node("Cast", ["f"], ["y"], to=I64)],
                      INT64_MAX, "FLOAT"),
    "reshape_target": ([oh.make_node("Greater", ["x", "hundred"], ["b"]), oh.make_node("Shape", ["x"], ["s"]),
                        oh.make_node("ReduceMax", ["b"], ["any"], keepdims=1),
                        oh.make_node("Where", ["any", "c_shape", "s"], ["target"]),
                        oh.make_node("Reshape", ["x", "target"], ["y"])], INT64_MAX, "target shape"),
    "no_rule": ([oh.make_node("CumSum", ["c", "zero"], ["s"]), oh.make_node("Where", ["odd_false", "s", "x"], ["y"])],
                INT64_MIN, "(CumSum) has no range rule"),
    # the condition itself comes from the run-time input: either branch may be taken
    "where_runtime_condition": ([oh.make_node("Greater", ["x", "zero"], ["b"]),
                                 oh.make_node("Where", ["b", "c", "x"], ["y"])], INT64_MAX, "graph output"),
    # int32 arithmetic on the saturated value wraps where int64 does not
    "wraps_after_saturation": ([oh.make_node("Sub", ["c", "one_scalar"], ["m"]),
                                oh.make_node("Max", ["m", "zero"], ["n"]),
                                oh.make_node("Add", ["n", "x"], ["y"])], INT64_MAX, "graph output"),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_kept_sentinels_name_the_reader(case):
    nodes, sentinel, words = KEPT[case]
    constants = [_sentinels(sentinel), _const("c_shape", [sentinel]), _const("fifteen", 15), _const("one_scalar", 1),
                 _const("always", np.ones(N, bool), np.bool_)]
    used = {name for node in nodes for name in node.input}
    model = _graph(nodes, [c for c in constants + _HELPERS if c.name in used])
    saturated, kept = _apply(model, _feeds(low=0, high=N))
    name = "c_shape" if "c_shape" in used else "c"
    assert not saturated and list(kept) == [name], (saturated, kept)
    assert words in kept[name], kept[name]
    assert not _in_range(model)


def test_kept_reason_reaches_the_readers_as_metadata():
    """What the backend's refusal reads: the reason, on each node reading the kept constant, through the
    stage file between optimise and lower."""
    model = _graph([oh.make_node("Min", ["c", "x"], ["y"])], [_sentinels(INT64_MIN)])
    pass_ = get_registry().tables["passes"]["saturate_discarded_int64"].obj
    assert pass_.apply(model) == 0
    reloaded = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    [reader] = [node for node in reloaded.graph if node.op_type == "Min"]
    assert INT_RANGE in reader.metadata_props
    assert "int32" in int_range_reason(reader) and "graph output 'y'" in int_range_reason(reader)


def test_registered_after_folding_and_on_by_default():
    entry = get_registry().tables["passes"]["saturate_discarded_int64"].obj
    assert entry.default and not entry.before_folding
    model, feeds = _t5_buckets()
    before = _run(model, feeds)
    assert entry.apply(model) == 1
    assert all(np.allclose(a, b) for a, b in zip(before, _run(model, feeds)))


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_limit_is_a_parameter(bits):
    """The same proof for any width: INT64_MAX picked away by Where, and a value outside int``bits``
    that Min clamps to an in-range bound."""
    big = 2 ** (bits - 1) + 5
    nodes = [oh.make_node("Where", ["odd_false", "c", "x"], ["w"]), oh.make_node("Min", ["w", "big"], ["y"])]
    model = _graph(nodes, [_sentinels(INT64_MAX), _const("big", big), _HELPERS[-1]])
    saturated, kept = _apply(model, _feeds(low=-100, high=100), bits)
    assert sorted(saturated) == ["big", "c"] and not kept and _in_range(model, bits)


def test_shapes_unknown_summarise_and_still_prove():
    """Without static shapes the analysis keeps one summary per tensor: a Min against a bound below
    both the sentinel and its saturated value still proves it."""
    nodes = [oh.make_node("Reshape", ["c", "flat"], ["r"]), oh.make_node("Min", ["r", "x"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", I64, ["n"])],
                          [oh.make_tensor_value_info("y", I64, None)],
                          [_const("c", [INT64_MAX] * N), _const("flat", [-1])])
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    saturated, kept = _apply(model, _feeds())
    assert saturated == ["c"] and not kept


def test_subgraph_readers_keep_it():
    then_branch = oh.make_graph([oh.make_node("Identity", ["c"], ["t"])], "then", [],
                                [oh.make_tensor_value_info("t", I64, [N])])
    else_branch = oh.make_graph([oh.make_node("Identity", ["x"], ["e"])], "else", [],
                                [oh.make_tensor_value_info("e", I64, [N])])
    nodes = [oh.make_node("ReduceMax", ["x"], ["top"], keepdims=0), oh.make_node("Greater", ["top", "zero"], ["cond"]),
             oh.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    model = _graph(nodes, [_sentinels(INT64_MIN), _const("zero", 0)])
    saturated, kept = _apply(model, _feeds())
    assert not saturated and "subgraph" in kept["c"]


def test_in_range_constants_are_left_alone():
    nodes = [oh.make_node("Add", ["c", "x"], ["y"])]
    model = _graph(nodes, [_const("c", np.arange(N) * 1000)])
    assert _apply(model, _feeds()) == ([], {})


def _t5_decoder_buckets(exact: int = 3, buckets: int = 8):
    """The decoder's form of the buckets, left unfolded where onnxscript stops at a ConstantOfShape:
    ``-Min(rel, 0)``, then the large branch through Log (Log(0) = -inf cast to int64), all computable
    at build time, with the bucket then added to a run-time input."""
    rel = np.arange(N)[None, :] - np.arange(N)[:, None]
    nodes = [
        oh.make_node("ConstantOfShape", ["shape"], ["zeros"], value=_const("v0", [0])),
        oh.make_node("Min", ["rel", "zeros"], ["m"]), oh.make_node("Neg", ["m"], ["distance"]),
        oh.make_node("Less", ["distance", "exact"], ["is_small"]),
        oh.make_node("Cast", ["distance"], ["f"], to=F32), oh.make_node("Div", ["f", "exact_f"], ["ratio"]),
        oh.make_node("Log", ["ratio"], ["log"]), oh.make_node("Mul", ["log", "scale"], ["scaled"]),
        oh.make_node("Cast", ["scaled"], ["large_part"], to=I64),
        oh.make_node("Add", ["large_part", "exact"], ["large"]),
        oh.make_node("ConstantOfShape", ["shape"], ["last"], value=_const("v", [buckets - 1])),
        oh.make_node("Min", ["large", "last"], ["clamped"]),
        oh.make_node("Where", ["is_small", "distance", "clamped"], ["bucket"]),
        oh.make_node("Add", ["bucket", "positions"], ["y"]),
    ]
    initializers = [_const("rel", rel), _const("shape", [N, N]), _const("exact", exact),
                    _const("exact_f", exact, np.float32),
                    _const("scale", (buckets - exact) / np.log(16 / exact), np.float32)]
    model = _model(nodes, [oh.make_tensor_value_info("positions", I64, [N, N])],
                   [oh.make_tensor_value_info("y", I64, [N, N])], initializers)
    return model, {"positions": np.random.default_rng(1).integers(0, buckets, (N, N))}


def test_build_time_buckets_fold_to_their_in_range_result():
    """Every reader of the -2**63 intermediates is computable at build time: the pass folds the first
    reader whose result is in range (the Where), so no out-of-range value is left."""
    model, feeds = _t5_decoder_buckets()
    entry = get_registry().tables["passes"]["saturate_discarded_int64"].obj
    before = _run(model, feeds)
    assert entry.apply(model) >= 1
    assert np.array_equal(before[0], _run(model, feeds)[0])
    assert {node.op_type for node in model.graph} == {"Add"} and _in_range(model)


def test_build_time_sentinel_with_a_run_time_reader_is_saturated():
    """``Cast(Log(0))`` computed at build time, read by ``Max`` with a run-time operand: folded into a
    constant, then proven (the backend's x is at or above -2**31, so Max gives x in both)."""
    nodes = [oh.make_node("ConstantOfShape", ["shape"], ["zeros"], value=_const("v0", [0.0], np.float32)),
             oh.make_node("Log", ["zeros"], ["minus_inf"]), oh.make_node("Cast", ["minus_inf"], ["c"], to=I64),
             oh.make_node("Max", ["c", "x"], ["y"])]
    model = _graph(nodes, [_const("shape", [N])])
    entry = get_registry().tables["passes"]["saturate_discarded_int64"].obj
    before = _run(model, _feeds())
    assert entry.apply(model) == 2  # one fold, one saturation
    assert np.array_equal(before[0], _run(model, _feeds())[0])
    assert {node.op_type for node in model.graph} == {"Max"} and _in_range(model)


def test_constant_nodes_without_inferred_types():
    """The sentinel from a Constant node, read through an Identity, with no shape inference run: the
    types come from the producers, and the saturated value lands in the node's attribute."""
    nodes = [oh.make_node("Constant", [], ["c"], value=_sentinels(INT64_MAX)), oh.make_node("Identity", ["c"], ["i"]),
             oh.make_node("Where", ["odd_false", "i", "x"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", I64, [N])],
                          [oh.make_tensor_value_info("y", I64, None)], [_HELPERS[-1]])
    model = ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    saturated, kept = _apply(model, _feeds())
    assert saturated == ["c"] and not kept
    [constant] = [node for node in model.graph if node.op_type == "Constant"]
    assert constant.attributes["value"].value.numpy().max() == INT32_MAX


def _first_index(mask):
    """``Where(mask, arange, INT64_MAX)`` then ReduceMin: the first index where ``mask`` holds, plus ``x``."""
    nodes = [oh.make_node("Where", ["mask", "positions", "c"], ["w"]),
             oh.make_node("ReduceMin", ["w"], ["first"], keepdims=0), oh.make_node("Add", ["first", "x"], ["y"])]
    return _graph(nodes, [_const("mask", mask, np.bool_), _const("positions", np.arange(N)), _const("c", [INT64_MAX] * N)])


@pytest.mark.parametrize("reduce_op", ["ReduceMin", "ReduceMax"])
def test_reductions_that_never_pick_the_sentinel_saturate_it(reduce_op):
    """The first (or last, from INT64_MIN) index where a mask holds: one element the same in both lies
    beyond every sentinel, so the reduction never returns it."""
    model = _first_index(np.arange(N) == 3)
    if reduce_op == "ReduceMax":
        for node in model.graph:
            if node.op_type == "ReduceMin":
                node.op_type = "ReduceMax"
        model.graph.initializers["c"].const_value = ir.tensor(np.full(N, INT64_MIN), name="c")
    saturated, kept = _apply(model, _feeds(shape=()))
    assert saturated == ["c"] and not kept


def test_reduction_of_only_sentinels_keeps_them():
    saturated, kept = _apply(_first_index(np.zeros(N, bool)), _feeds(shape=()))
    assert not saturated and "graph output 'y'" in kept["c"]
