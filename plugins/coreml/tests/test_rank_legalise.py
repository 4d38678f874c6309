"""Values of rank > 5 are folded to rank <= 5 (lowering.rank), or the build names why it cannot.

Each graph is one pattern real models make (window attention, grid partitions, correlation volumes,
a Gather with 2-D indices on 5-D data), built with onnx.helper, lowered, checked for no tensor of
rank > 5 (coremltools' own check on the program) and run in the MIL interpreter against onnxruntime.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from onnx_cases import IR_VERSION, lower, rand, run_onnxruntime

from edgebuild_coreml.lowering.errors import DeclinedForm
from edgebuild_coreml.lowering.rank import MAX_RANK, transpose_steps

F = onnx.TensorProto.FLOAT


def _model(nodes, inputs: dict, outputs: dict, initializers: dict | None = None, opset: int = 18):
    graph = oh.make_graph(
        nodes, "rank",
        [oh.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs.items()],
        [oh.make_tensor_value_info(n, F if dtype is None else dtype, None) for n, dtype in outputs.items()],
        [onh.from_array(np.asarray(v), n) for n, v in (initializers or {}).items()],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def _highest_rank(program) -> int:
    ranks = [o.rank for op in program.functions["main"].operations for o in op.outputs if hasattr(o, "rank")]
    return max(ranks)


def _check(model, inputs: dict, *, precision: str = "float32", cosine: float = 0.99999):
    """Lowered without a tensor of rank > 5, coremltools' validation passes, outputs match onnxruntime."""
    from edgebuild_coreml.interpreter import run_program

    result = lower(model, precision=precision)
    assert _highest_rank(result.program) <= MAX_RANK
    result.program._check_invalid_tensor_rank()  # coremltools' check ("Core ML only supports tensors with rank <= 5")
    expected = run_onnxruntime(model, inputs)
    produced = run_program(result.program, {result.input_names[k]: v for k, v in inputs.items()},
                           fp16=precision == "float16")
    for name, reference in expected.items():
        got = np.asarray(produced[result.output_names[name]])
        assert got.shape == reference.shape, name
        if reference.dtype.kind in "iub":
            np.testing.assert_array_equal(got.astype(np.int64), reference.astype(np.int64))
            continue
        a, b = got.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= cosine, name
        if precision == "float32":
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    return result


# -- reshape -> transpose -> reshape: window and grid partitions ------------------------------------
def _partition(x_shape, six, perm, back):
    nodes = [
        oh.make_node("Reshape", ["x", "six"], ["h"], name="to6"),
        oh.make_node("Transpose", ["h"], ["t"], perm=perm, name="swap"),
        oh.make_node("Reshape", ["t", "back"], ["y"], name="back_to_low"),
    ]
    graph_inits = {"six": np.array(six, np.int64), "back": np.array(back, np.int64)}
    return _model(nodes, {"x": rand(*x_shape)}, {"y": None}, graph_inits), {"x": rand(*x_shape)}


@pytest.mark.parametrize("batch", [1, 2])
def test_swin_window_partition(batch):
    """[B, H, W, C] -> [B, H/w, w, W/w, w, C] -> perm (0, 1, 3, 2, 4, 5) -> [B*nW, w*w, C]."""
    model, inputs = _partition((batch, 8, 8, 6), [batch, 2, 4, 2, 4, 6], [0, 1, 3, 2, 4, 5], [batch * 4, 16, 6])
    result = _check(model, inputs)
    assert result.op_counts.get("transpose") == 1  # runs the permutation keeps together move as one dim
    assert result.op_counts.get("reshape") == 2  # as many as the source: reshapes of reshapes are merged


@pytest.mark.parametrize("batch", [1, 2])
def test_maxvit_grid_partition_of_six_runs(batch):
    """MaxViT's perm (0, 2, 4, 3, 5, 1) keeps no two dims together: with a batch of 2 six runs move,
    which takes a chain of rank-4 transposes; with a batch of 1 the size-1 dim drops out (one transpose)."""
    model, inputs = _partition((batch, 6, 8, 8), [batch, 6, 2, 4, 2, 4], [0, 2, 4, 3, 5, 1], [batch, 4, 16, 6])
    result = _check(model, inputs)
    assert (result.op_counts.get("transpose") == 1) == (batch == 1)


@pytest.mark.parametrize("batch", [1, 2])
def test_video_swin_window_partition_of_rank_eight(batch):
    """Video Swin's 3-D windows: [B, D, H, W, C] -> rank 8 -> perm (0, 1, 3, 5, 2, 4, 6, 7) -> [B*nW, w^3, C];
    with a batch above 1 six runs move (a chain of rank-4 transposes)."""
    model, inputs = _partition((batch, 4, 8, 8, 3), [batch, 2, 2, 2, 4, 2, 4, 3], [0, 1, 3, 5, 2, 4, 6, 7],
                               [batch * 8, 32, 3])
    _check(model, inputs)


def test_partition_after_departition():
    """MaxViT as exported: a departition ends in a rank-4 value that the next partition reshapes to rank 6
    again (the rank-4 value is rewritten once and read by the next rewrite)."""
    nodes = [
        oh.make_node("Reshape", ["x", "six"], ["h"], name="part"),
        oh.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 4, 3, 5, 1], name="part_swap"),
        oh.make_node("Reshape", ["t", "four"], ["w"], name="windows"),
        oh.make_node("Relu", ["w"], ["r"], name="relu"),
        oh.make_node("Reshape", ["r", "six_back"], ["h2"], name="depart"),
        oh.make_node("Transpose", ["h2"], ["t2"], perm=[0, 5, 1, 3, 2, 4], name="depart_swap"),
        oh.make_node("Reshape", ["t2", "image"], ["g"], name="image_again"),
        oh.make_node("Reshape", ["g", "six"], ["h3"], name="part2"),
        oh.make_node("Transpose", ["h3"], ["t3"], perm=[0, 2, 4, 3, 5, 1], name="part2_swap"),
        oh.make_node("Reshape", ["t3", "four"], ["y"], name="windows2"),
    ]
    inputs = {"x": rand(2, 6, 8, 8)}
    model = _model(nodes, inputs, {"y": None}, {
        "six": np.array([2, 6, 2, 4, 2, 4]), "four": np.array([2, 4, 16, 6]), "six_back": np.array([2, 2, 2, 4, 4, 6]),
        "image": np.array([2, 6, 8, 8])})
    _check(model, inputs)


@pytest.mark.parametrize("rank", [6, 7, 8])
def test_transpose_steps_move_data_as_transpose(rank):
    """Every permutation of a few shapes (size-1 dims among them): the steps, each of rank <= 5,
    leave the data in transpose's order."""
    rng = np.random.default_rng(rank)
    perms = list(itertools.permutations(range(rank)))
    for perm in [perms[i] for i in rng.choice(len(perms), 40, replace=False)]:
        shape = [int(s) for s in rng.choice([1, 2, 3], rank)]
        x = rng.standard_normal(shape)
        y = x.reshape(-1)
        for target, step in transpose_steps(shape, list(perm)):
            assert len(target) <= MAX_RANK
            y = y.reshape(target).transpose(step)
        np.testing.assert_array_equal(y.reshape(-1), np.transpose(x, perm).reshape(-1))


# -- ops between the reshapes: the folded dims must not be the ones the op works on ----------------
def _six(x_shape, six, middle, back, extra_inputs=None, initializers=None, out_dtype=None):
    nodes = [oh.make_node("Reshape", ["x", "six"], ["h"], name="to6"), *middle,
             oh.make_node("Reshape", ["m", "back"], ["y"], name="back_to_low")]
    inits = {"six": np.array(six, np.int64), "back": np.array(back, np.int64), **(initializers or {})}
    inputs = {"x": rand(*x_shape), **(extra_inputs or {})}
    return _model(nodes, inputs, {"y": out_dtype}, inits), inputs


def test_elementwise_with_broadcasting():
    """Add of an operand broadcast over some dims, Mul by a scalar, Relu: the broadcast dims stay apart."""
    bias = rand(1, 1, 4, 1, 4, 3, seed=1)
    middle = [oh.make_node("Add", ["h", "bias"], ["a"], name="add_bias"),
              oh.make_node("Mul", ["a", "half"], ["b"], name="scale"),
              oh.make_node("Relu", ["b"], ["m"], name="relu")]
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, [2, 8, 8, 3],
                         initializers={"bias": bias, "half": np.float32(0.5)})
    _check(model, inputs)


def test_elementwise_with_a_runtime_operand_of_lower_rank():
    """A rank-3 runtime operand, right-aligned against the 6-D value, reshaped to its folded form."""
    middle = [oh.make_node("Mul", ["h", "gate"], ["m"], name="gate_mul")]
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, [2, 8, 8, 3],
                         extra_inputs={"gate": rand(2, 4, 3, seed=2)})
    _check(model, inputs)


@pytest.mark.parametrize("axis", [-1, 2])
def test_softmax_along_one_axis(axis):
    middle = [oh.make_node("Softmax", ["h"], ["m"], axis=axis, name="softmax")]
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, [2, 8, 8, 3])
    _check(model, inputs)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduction_over_adjacent_axes(keepdims):
    """ReduceMean over axes 2, 3 of a 6-D value: adjacent reduced axes may fold into one."""
    back = [2, 2, 4, 3]
    middle = [oh.make_node("ReduceMean", ["h", "axes"], ["m"], keepdims=keepdims, name="mean")]
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, back, initializers={"axes": np.array([2, 3])})
    _check(model, inputs)


def test_reduction_to_a_lower_rank_output():
    """ReduceSum over one axis of a 6-D value, keepdims=0: the result is rank 5 and leaves the folded region."""
    nodes = [oh.make_node("Reshape", ["x", "six"], ["h"], name="to6"),
             oh.make_node("ReduceSum", ["h", "axes"], ["y"], keepdims=0, name="sum")]
    inputs = {"x": rand(2, 8, 8, 3)}
    model = _model(nodes, inputs, {"y": None}, {"six": np.array([2, 2, 4, 2, 4, 3]), "axes": np.array([2])})
    _check(model, inputs)


def test_batched_matmul_of_six_dims():
    """Attention scores per window: [B, nH, nW, heads, T, d] @ [B, nH, nW, heads, d, T]."""
    nodes = [oh.make_node("Reshape", ["q", "six"], ["q6"], name="q6"),
             oh.make_node("Reshape", ["k", "six"], ["k6"], name="k6"),
             oh.make_node("Transpose", ["k6"], ["kt"], perm=[0, 1, 2, 3, 5, 4], name="kt"),
             oh.make_node("MatMul", ["q6", "kt"], ["s"], name="scores"),
             oh.make_node("Softmax", ["s"], ["m"], axis=-1, name="softmax"),
             oh.make_node("Reshape", ["m", "back"], ["y"], name="back_to_low")]
    inputs = {"q": rand(2, 2, 2, 2, 4, 3), "k": rand(2, 2, 2, 2, 4, 3, seed=3)}
    inputs = {n: a.reshape(2, 8, 2, 6) for n, a in inputs.items()}
    model = _model(nodes, inputs, {"y": None}, {"six": np.array([2, 2, 2, 2, 4, 3]), "back": np.array([2, 8, 2, 8])})
    _check(model, inputs)


def test_matmul_whose_batch_dims_broadcast():
    """[2, 2, 1, 2, 4, 3] @ a constant [1, 1, 2, 1, 3, 4]: each operand's broadcast batch dims stay apart."""
    nodes = [oh.make_node("Reshape", ["q", "six"], ["q6"], name="q6"),
             oh.make_node("MatMul", ["q6", "k"], ["s"], name="scores"),
             oh.make_node("Reshape", ["s", "back"], ["y"], name="back_to_low")]
    inputs = {"q": rand(2, 2, 2, 12)}
    model = _model(nodes, inputs, {"y": None}, {"six": np.array([2, 2, 1, 2, 4, 3]), "k": rand(1, 1, 2, 1, 3, 4, seed=3),
                                                "back": np.array([2, 2, 2, 32])})
    _check(model, inputs)


def test_gather_with_2d_indices_on_5d_data():
    """A speech-enhancement net's frame gather: 5-D data, 2-D indices on axis 2 -> a rank-6 result."""
    indices = np.array([[0, 1, 2], [2, 3, 4], [4, 5, 6]], np.int64)
    nodes = [oh.make_node("Gather", ["x", "idx"], ["g"], axis=2, name="frames"),
             oh.make_node("Mul", ["g", "w"], ["m"], name="window"),
             oh.make_node("ReduceSum", ["m", "axes"], ["y"], keepdims=0, name="sum")]
    inputs = {"x": rand(1, 2, 7, 4, 5)}
    w = rand(3, 1, 1, 1, seed=4)  # a per-offset weight, broadcast over the trailing dims
    model = _model(nodes, inputs, {"y": None}, {"idx": indices, "w": w, "axes": np.array([3])})
    _check(model, inputs)


@pytest.mark.parametrize("attrs", [{"dilations": [1, 2, 2]}, {"indices": True}], ids=["dilated", "indices"])
def test_max_pool_3d_whose_taps_stack_to_rank_six(attrs):
    """MaxPool over 5-D input with dilations or an Indices output: the lowering stacks each window's
    taps into a rank-6 value and reduces over them (and picks the tap's index with gather_along_axis)."""
    indices = attrs.pop("indices", False)
    outputs = ["y", "where"] if indices else ["y"]
    node = oh.make_node("MaxPool", ["x"], outputs, kernel_shape=[2, 2, 2], strides=[1, 2, 2], name="pool", **attrs)
    inputs = {"x": rand(1, 2, 4, 8, 8)}
    model = _model([node], inputs, {"y": None, **({"where": onnx.TensorProto.INT64} if indices else {})})
    _check(model, inputs)


def test_deform_conv_offsets_and_mask_at_rank_six():
    """DeformConv's lowering splits offsets and scales the taps by the mask as [N, G, taps, 2|C, oh, ow]."""
    inputs = {"x": rand(1, 4, 6, 6, seed=34), "w": rand(4, 2, 3, 3, seed=35),
              "offset": rand(1, 2 * 9 * 2, 6, 6, seed=36, low=-2.5, high=2.5), "b": rand(4, seed=37),
              "mask": rand(1, 2 * 9, 6, 6, seed=38, low=0.0, high=1.0)}
    node = oh.make_node("DeformConv", list(inputs), ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2,
                        offset_group=2, name="deform")
    model = _model([node], inputs, {"y": None}, opset=19)
    _check(model, inputs)


def test_concat_and_slice_on_six_dims():
    nodes = [oh.make_node("Reshape", ["x", "six"], ["h"], name="to6"),
             oh.make_node("Concat", ["h", "h"], ["c"], axis=3, name="cat"),
             oh.make_node("Slice", ["c", "starts", "ends", "axes"], ["m"], name="crop"),
             oh.make_node("Reshape", ["m", "back"], ["y"], name="back_to_low")]
    inputs = {"x": rand(2, 8, 8, 3)}
    model = _model(nodes, inputs, {"y": None}, {
        "six": np.array([2, 2, 4, 2, 4, 3]), "starts": np.array([1]), "ends": np.array([3]), "axes": np.array([3]),
        "back": np.array([2, 2, 4, 2, 4 * 3])})
    _check(model, inputs)


MASK = rand(1, 1, 4, 1, 4, 3, seed=6) > 0  # a bool operand broadcast over the window dims
OPS_BETWEEN = {
    # id: (nodes from "h" to "m", initializers)
    "layer_norm": ([oh.make_node("LayerNormalization", ["h", "scale", "bias"], ["m"], axis=-1, name="norm")],
                   {"scale": rand(3, seed=7), "bias": rand(3, seed=8)}),
    "where": ([oh.make_node("Where", ["mask", "h", "zero"], ["m"], name="masked")],
              {"mask": MASK, "zero": np.float32(0)}),
    "expand": ([oh.make_node("Unsqueeze", ["h", "at1"], ["u"], name="unsq"),
                oh.make_node("ReduceMax", ["u", "at1"], ["r"], keepdims=0, name="rmax"),
                oh.make_node("Expand", ["r", "wide"], ["m"], name="expand")],
               {"at1": np.array([1]), "wide": np.array([2, 2, 2, 4, 2, 4, 3])}),
    "cast_and_unary": ([oh.make_node("Abs", ["h"], ["a"], name="abs"),
                        oh.make_node("Sqrt", ["a"], ["b"], name="sqrt"),
                        oh.make_node("Cast", ["b"], ["m"], to=onnx.TensorProto.FLOAT16, name="cast")], {}),
    "squeeze_to_five": ([oh.make_node("Unsqueeze", ["h", "at0"], ["u"], name="unsq"),
                         oh.make_node("Squeeze", ["u", "at0"], ["v"], name="sq"),
                         oh.make_node("Neg", ["v"], ["m"], name="neg")], {"at0": np.array([0])}),
    "tile": ([oh.make_node("Tile", ["h", "reps"], ["m"], name="tile")], {"reps": np.array([1, 1, 2, 1, 1, 1])}),
    "split": ([oh.make_node("Split", ["h", "halves"], ["s0", "s1"], axis=4, name="split"),
               oh.make_node("Sub", ["s0", "s1"], ["m"], name="diff")], {"halves": np.array([2, 2])}),
    "topk": ([oh.make_node("TopK", ["h", "k"], ["m", "i"], axis=-1, name="top")], {"k": np.array([2])}),
    "cumsum": ([oh.make_node("CumSum", ["h", "axis"], ["m"], name="cumsum")], {"axis": np.array(3)}),
    "argmax": ([oh.make_node("ArgMax", ["h"], ["a"], axis=2, keepdims=1, name="argmax"),
                oh.make_node("Cast", ["a"], ["m"], to=onnx.TensorProto.FLOAT, name="cast")], {}),
    "pad": ([oh.make_node("Pad", ["h", "pads"], ["m"], mode="constant", name="pad")],
            {"pads": np.array([0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1])}),
    "matmul_by_weight": ([oh.make_node("MatMul", ["h", "weight"], ["m"], name="proj")], {"weight": rand(3, 5, seed=9)}),
    "gather_elements": ([oh.make_node("GatherElements", ["h", "pick"], ["m"], axis=5, name="pick")],
                        {"pick": np.random.default_rng(0).integers(0, 3, (2, 2, 4, 2, 4, 2))}),
}


@pytest.mark.parametrize("case", OPS_BETWEEN)
def test_op_on_six_dims(case):
    """Each op kind between a rank-6 reshape and a reshape back, its dims folded around what it works on."""
    middle, initializers = OPS_BETWEEN[case]
    out_dtype = onnx.TensorProto.FLOAT16 if case == "cast_and_unary" else None
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, [2, -1], initializers=initializers,
                         out_dtype=out_dtype)
    _check(model, inputs)


def test_fp16_build_of_a_folded_graph():
    bias = rand(1, 1, 4, 1, 4, 3, seed=1)
    middle = [oh.make_node("Add", ["h", "bias"], ["a"], name="add_bias"),
              oh.make_node("Softmax", ["a"], ["m"], axis=-1, name="softmax")]
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, [2, 8, 8, 3], initializers={"bias": bias})
    _check(model, inputs, precision="float16", cosine=0.999)


# -- refusals: before coremltools, naming the node, the shape and why -------------------------------
def test_rank_six_model_output_is_refused():
    nodes = [oh.make_node("Reshape", ["x", "six"], ["y"], name="to6")]
    inputs = {"x": rand(2, 8, 8, 3)}
    model = _model(nodes, inputs, {"y": None}, {"six": np.array([2, 2, 4, 2, 4, 3])})
    with pytest.raises(DeclinedForm) as caught:
        lower(model)
    message = str(caught.value)
    assert "node 'to6' (Reshape)" in message and "rank-6 tensor [2, 2, 4, 2, 4, 3]" in message
    assert "model output" in message and "Core ML holds rank <= 5" in message


def test_dims_no_fold_can_join_are_refused():
    """A run-time operand that broadcasts over every other of six dims keeps all six apart."""
    middle = [oh.make_node("Reshape", ["gate", "checkered"], ["checker"], name="checker"),
              oh.make_node("Add", ["h", "checker"], ["m"], name="checker_add")]
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, [2, 8, 8, 3],
                         extra_inputs={"gate": rand(2, 4, 4, seed=5)},
                         initializers={"checkered": np.array([2, 1, 4, 1, 4, 1])})
    with pytest.raises(DeclinedForm) as caught:
        lower(model)
    message = str(caught.value)
    assert "makes a rank-6 tensor [2, 2, 4, 2, 4, 3]" in message
    assert "keep 6 of them apart" in message and "checker_add" in message and "broadcasts" in message


def test_a_constant_broadcast_over_every_other_dim_is_stored_at_full_size():
    """The same pattern with a constant operand folds: the constant is stored broadcast, so its dims join."""
    middle = [oh.make_node("Add", ["h", "checker"], ["m"], name="checker_add")]
    model, inputs = _six((2, 8, 8, 3), [2, 2, 4, 2, 4, 3], middle, [2, 8, 8, 3],
                         initializers={"checker": rand(2, 1, 4, 1, 4, 1, seed=5)})
    _check(model, inputs)


def test_rank_six_model_input_is_refused():
    nodes = [oh.make_node("Relu", ["x"], ["r"], name="relu"),
             oh.make_node("Reshape", ["r", "back"], ["y"], name="back_to_low")]
    inputs = {"x": rand(2, 2, 4, 2, 4, 3)}
    model = _model(nodes, inputs, {"y": None}, {"back": np.array([2, 8, 8, 3])})
    with pytest.raises(DeclinedForm, match=r"model input 'x' is a rank-6 tensor \[2, 2, 4, 2, 4, 3\]"):
        lower(model)


def test_op_the_pass_cannot_fold_through_is_refused():
    """NonZero lists a coordinate per dim of a 6-D value: no folding keeps its result, and the op is named."""
    nodes = [oh.make_node("Reshape", ["x", "six"], ["h"], name="to6"),
             oh.make_node("NonZero", ["h"], ["y"], name="pick")]
    inputs = {"x": rand(2, 8, 8, 3)}
    model = _model(nodes, inputs, {"y": onnx.TensorProto.INT64}, {"six": np.array([2, 2, 4, 2, 4, 3])})
    with pytest.raises(DeclinedForm) as caught:
        lower(model)
    message = str(caught.value)
    assert "rank-6 tensor" in message and "could not fold its dims" in message and "'pick'" in message


def test_program_without_high_ranks_is_left_alone():
    """A program holding a list (a ListVar has no shape) and nothing of rank > 5: nothing changes."""
    from coremltools.converters.mil import Builder as mb

    from edgebuild_coreml.lowering.rank import legalise_ranks

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))])
    def program(x):
        frames = mb.make_list(init_length=1, elem_shape=(2, 3), dtype="fp32")
        frames = mb.list_write(ls=frames, index=0, value=x)
        return mb.list_read(ls=frames, index=0)

    before = [op.op_type for op in program.functions["main"].operations]
    assert legalise_ranks(program.functions["main"]) == 0
    assert [op.op_type for op in program.functions["main"].operations] == before
