"""Every form of com.microsoft DynamicQuantizeLSTM, unrolled, against onnxruntime's own kernel.

Each case is one DynamicQuantizeLSTM node written as quantize_dynamic writes it (onnx.helper with
the contrib op); onnxruntime runs it (one thread: it then quantises the batch's hidden state as
one tensor, as the unrolled graph does) and runs the unrolled standard-op graph, which must
agree to fp32 rounding (the integer products are exact) and keep the weights int8/uint8.

The forms: direction forward / reverse / bidirectional; sequence_lens absent, all equal, varying
(constant) and given at run time; initial_h / initial_c given or not; peepholes, clip,
input_forget; activations by default and listed per direction (with alpha / beta); weight scales
per tensor and per channel; int8 and uint8 weights; Y / Y_h / Y_c each used or not (Y unnamed).
int8 weights are drawn in 7 bits: onnxruntime's x86 uint8 x int8 kernel on CPUs without VNNI
saturates pairs of full-range products in int16 (quantize_dynamic's reduce_range does the same).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest

from edgebuild.graph.declined import declined_reason
from edgebuild.graph.quantized.dynamic import PASS
from edgebuild.graph.quantized.dynamic_lstm import PASS as LSTM_PASS

ort = pytest.importorskip("onnxruntime")

F, I32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
STEPS, FEATURES, HIDDEN = 6, 5, 4


@dataclass(frozen=True)
class Form:
    direction: str = "forward"
    batch: int = 3
    lengths: str = "none"  # none | equal | varying | positive (varying, none 0) | runtime
    states: bool = True
    peephole: bool = False
    clip: float | None = None
    input_forget: bool = False
    activations: tuple[str, ...] | None = None
    alphas: tuple[float, ...] = ()
    betas: tuple[float, ...] = ()
    per_channel: bool = False
    weight: str = "int8"  # int8 | uint8
    outputs: tuple[bool, bool, bool] = (True, True, True)  # Y, Y_h, Y_c named
    bias: bool = True

    @property
    def dirs(self) -> int:
        return 2 if self.direction == "bidirectional" else 1


LISTED = ("Sigmoid", "Tanh", "Tanh")
PER_DIRECTION = ("HardSigmoid", "Softsign", "Elu", "Sigmoid", "ScaledTanh", "LeakyRelu")
FORMS = {
    "plain": Form(),
    "batch1": Form(batch=1, states=False),
    "no_states": Form(states=False),
    "no_bias": Form(bias=False),
    "equal_lengths": Form(lengths="equal"),
    "varying_lengths": Form(lengths="varying"),
    "varying_no_states": Form(lengths="varying", states=False),
    "runtime_lengths": Form(lengths="runtime"),
    # without Y, onnxruntime's next step reads a length-0 row's hidden state from Y_h's unwritten buffer
    "varying_without_y": Form(lengths="positive", outputs=(False, True, True)),
    "peephole": Form(peephole=True),
    "peephole_varying": Form(peephole=True, lengths="varying"),
    "clip_input_forget": Form(clip=0.7, input_forget=True),
    "listed_activations": Form(activations=LISTED),
    "other_activations": Form(activations=("Affine", "Relu", "Softplus"), alphas=(0.5,), betas=(0.1,)),
    "thresholded": Form(activations=("Sigmoid", "ThresholdedRelu", "Tanh"), alphas=(0.2,)),
    "per_channel": Form(per_channel=True),
    "uint8": Form(weight="uint8"),
    "uint8_per_channel_varying": Form(weight="uint8", per_channel=True, lengths="varying"),
    "only_y_h": Form(outputs=(False, True, False)),
    "only_y": Form(outputs=(True, False, False)),
    "y_and_y_c": Form(outputs=(True, False, True)),
}


def _weights(rng, form: Form, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quantised weight, scale, zero point) per direction as quantize_dynamic lays them out."""
    params = (form.dirs, 4 * HIDDEN) if form.per_channel else (form.dirs,)
    scale = rng.uniform(0.004, 0.02, params).astype(np.float32)
    if form.weight == "uint8":
        data = rng.integers(0, 256, shape).astype(np.uint8)
        # onnxruntime requires a per-channel uint8 zero point to hold one value (across directions too)
        zero = np.full(params, rng.integers(100, 156), np.uint8) if form.per_channel else \
            rng.integers(100, 156, params).astype(np.uint8)
        return data, scale, zero
    return rng.integers(-64, 64, shape).astype(np.int8), scale, np.zeros(params, np.int8)


def _case(form: Form, seed: int = 0):
    """(model, feeds) of one DynamicQuantizeLSTM node in ``form``."""
    rng = np.random.default_rng(seed)
    dirs, batch = form.dirs, form.batch
    w, w_scale, w_zero = _weights(rng, form, (dirs, FEATURES, 4 * HIDDEN))
    r, r_scale, r_zero = _weights(rng, form, (dirs, HIDDEN, 4 * HIDDEN))
    inits = [onh.from_array(w, "w"), onh.from_array(r, "r"), onh.from_array(w_scale, "ws"),
             onh.from_array(w_zero, "wz"), onh.from_array(r_scale, "rs"), onh.from_array(r_zero, "rz")]
    inputs = [oh.make_tensor_value_info("x", F, [STEPS, batch, FEATURES])]
    feeds = {"x": rng.normal(size=(STEPS, batch, FEATURES)).astype(np.float32)}
    names = ["x", "w", "r", "", "", "", "", "", "ws", "wz", "rs", "rz"]
    if form.bias:
        inits.append(onh.from_array(rng.normal(scale=0.3, size=(dirs, 8 * HIDDEN)).astype(np.float32), "b"))
        names[3] = "b"
    lengths = {"equal": np.full(batch, STEPS), "varying": np.array([STEPS, 2, 0, 4, 1][:batch]),
               "positive": np.array([STEPS, 2, 4, 1][:batch]),
               "runtime": np.array([3, STEPS, 1, 5][:batch])}.get(form.lengths)
    if lengths is not None:
        names[4] = "lengths"
        if form.lengths == "runtime":
            inputs.append(oh.make_tensor_value_info("lengths", I32, [batch]))
            feeds["lengths"] = lengths.astype(np.int32)
        else:
            inits.append(onh.from_array(lengths.astype(np.int32), "lengths"))
    if form.states:
        names[5:7] = ["h0", "c0"]
        for name in ("h0", "c0"):
            inputs.append(oh.make_tensor_value_info(name, F, [dirs, batch, HIDDEN]))
            feeds[name] = rng.uniform(-0.5, 0.5, (dirs, batch, HIDDEN)).astype(np.float32)
    if form.peephole:
        inits.append(onh.from_array(rng.normal(scale=0.5, size=(dirs, 3 * HIDDEN)).astype(np.float32), "p"))
        names[7] = "p"
    attributes = {"hidden_size": HIDDEN, "direction": form.direction}
    if form.clip is not None:
        attributes["clip"] = form.clip
    if form.input_forget:
        attributes["input_forget"] = 1
    if form.activations is not None:
        attributes["activations"] = list(form.activations) * (dirs if len(form.activations) == 3 else 1)
        if dirs == 1 and len(form.activations) == 6:
            attributes["activations"] = list(form.activations[:3])
    if form.alphas:
        attributes["activation_alpha"] = list(form.alphas) * dirs
    if form.betas:
        attributes["activation_beta"] = list(form.betas) * dirs
    outputs = [name if named else "" for name, named in zip(("y", "y_h", "y_c"), form.outputs)]
    node = oh.make_node("DynamicQuantizeLSTM", names, outputs, domain="com.microsoft", name="lstm", **attributes)
    graph = oh.make_graph([node], "case", inputs, [oh.make_tensor_value_info(n, F, None) for n in outputs if n],
                          inits)
    model = oh.make_model(graph, ir_version=10, opset_imports=[oh.make_opsetid("", 21),
                                                                oh.make_opsetid("com.microsoft", 1)])
    return model, feeds


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _unrolled(model: onnx.ModelProto, graph_pass=PASS) -> tuple[onnx.ModelProto, int]:
    ir_model = ir.serde.deserialize_model(model)
    fired = graph_pass.apply(ir_model)
    return ir.serde.serialize_model(ir_model), fired


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    return 1.0 if norm == 0 and not a.any() and not b.any() else float(a @ b / norm)


def _check(form: Form) -> onnx.ModelProto:
    model, feeds = _case(form)
    expected = _onnxruntime(model, feeds)
    unrolled, fired = _unrolled(model)
    assert fired == 1
    ops = [n.op_type for n in unrolled.graph.node]
    assert "DynamicQuantizeLSTM" not in ops and "LSTM" not in ops
    quantised = {i.name for i in unrolled.graph.initializer
                 if i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) and len(i.dims) == 2}
    assert len(quantised) == 2 * form.dirs  # W and R per direction, stored as they came
    got = _onnxruntime(unrolled, feeds)
    assert len(got) == len(expected)
    for e, g, name in zip(expected, got, [o.name for o in model.graph.output]):
        assert g.shape == e.shape, name
        assert _cosine(g, e) >= 0.99999, (name, _cosine(g, e))
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5, err_msg=name)
    return unrolled


# bidirectional runs both directions' code: every form; the single directions: the forms that
# treat them apart (step order, masks, reversal, states)
SINGLE = ["plain", "no_states", "varying_lengths", "runtime_lengths", "varying_without_y", "peephole_varying",
          "uint8", "only_y_h"]
CASES = [(name, "bidirectional") for name in FORMS] + [(n, d) for d in ("forward", "reverse") for n in SINGLE]


@pytest.mark.parametrize("name,direction", CASES)
def test_every_form_matches_onnxruntime(name, direction):
    _check(replace(FORMS[name], direction=direction))


def test_activations_listed_per_direction_follow_onnxruntime():
    """Six functions for two directions, alpha / beta taken in order by the functions that use them."""
    _check(Form(direction="bidirectional", activations=PER_DIRECTION, alphas=(0.3, 1.5, 0.8, 0.02),
                betas=(0.4, 1.2)))


def test_varying_lengths_become_step_masks():
    """Lengths varying per row: Where on step masks and, for the reverse direction, ReverseSequence."""
    unrolled = _check(Form(direction="bidirectional", lengths="runtime"))
    ops = [n.op_type for n in unrolled.graph.node]
    assert "Where" in ops and ops.count("ReverseSequence") == 2  # the reverse direction's input and output


def _declined(model: onnx.ModelProto) -> str | None:
    ir_model = ir.serde.deserialize_model(model)
    assert PASS.apply(ir_model) == 0 and LSTM_PASS.apply(ir_model) == 0
    [node] = [n for n in ir_model.graph if n.op_type == "DynamicQuantizeLSTM"]
    return declined_reason(node)


def test_unknown_sequence_length_is_declined_naming_the_dim():
    model, _ = _case(Form())
    model.graph.input[0].CopyFrom(oh.make_tensor_value_info("x", F, ["steps", 3, FEATURES]))
    reason = _declined(model)
    assert reason.startswith("DynamicQuantizeLSTM 'lstm': the sequence length of X (dim 0")
    assert "pin the input's shape" in reason


def test_unknown_activation_is_declined_naming_it():
    model, _ = _case(Form())
    node = model.graph.node[0]
    node.attribute.append(oh.make_attribute("activations", ["Sigmoid", "Gelu", "Tanh"]))
    assert "activation 'gelu' is none of" in _declined(model)
