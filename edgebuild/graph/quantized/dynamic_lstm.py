"""com.microsoft ``DynamicQuantizeLSTM`` -> an LSTM unrolled over its static sequence in standard ops.

What onnxruntime's CPU kernel computes (dynamic_quantize_lstm.cc, then the shared LSTM code of
uni_directional_lstm.cc and the quantised ComputeGemm of rnn_helpers.cc), per direction:

- the input projection X @ W is one GEMM over the whole sequence: X (all steps and batch rows)
  is quantised once to uint8 with the DynamicQuantizeLinear rule (range including 0, scale
  (max - min) / 255, zero point rounded half to even), and the int32 product is scaled by
  x_scale * W_scale (per column of W when W_scale is per channel);
- every step quantises the previous hidden state (the whole batch at once) the same way before
  its GEMM with R, and adds that to the step's input projection;
- the gates (order i, o, f, c), bias Wb + Rb, peepholes, clip and activations are the float
  LSTM of ai.onnx.

Here that is ``DynamicQuantizeLinear -> DequantizeLinear`` on X and on each step's hidden state,
``DequantizeLinear`` of the int8/uint8 weights and float MatMuls: the same quantised values,
with float rounding the only difference. onnxruntime computes the zero point from the first
element of a per-channel W_zero_point (it requires them equal, or zero for int8), which equals
the per-channel DequantizeLinear here. Two cases differ and are documented rather than refused:
when onnxruntime splits the batch across threads (batch > 4, or >= 2 with hidden size <= 256,
and more than one thread) it quantises each thread's rows of the hidden state separately (this
graph quantises the whole batch; batch 1 or one thread is exact), and an
all-zero tensor, which onnxruntime quantises with scale 1 and ai.onnx leaves at 0 scale (both
dequantise to zeros). Nodes with ``sequence_lens`` of varying lengths, runtime weights or
activations other than Sigmoid/Tanh/Relu are left for the backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.quantized._emit import const_array, onnx_opset, replace_output
from edgebuild.graph.quantized.dynamic import MS_DOMAIN, _input, _Rewriter, _Weight

_ACTIVATIONS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
_DEFAULT_ACTIVATIONS = ["Sigmoid", "Tanh", "Tanh"]
_SMALL = 4096  # elements: a shape or pads tensor, never a weight


def _is_lstm(node: ir.Node) -> bool:
    return node.op_type == "DynamicQuantizeLSTM" and node.domain == MS_DOMAIN


def _static_dims(value: ir.Value | None) -> list[int | None] | None:
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in value.shape]


def decompose_all(model: ir.Model, opset: int | None = None, *, infer: bool = False) -> int:
    """Rewrite every DynamicQuantizeLSTM whose sequence length is known; returns how many.

    ``infer``: run shape inference first when some X has no static sequence length (after
    constant folding, which computed pads and shapes in front of the LSTM usually need).
    """
    opset = onnx_opset(model) if opset is None else opset
    found = [(g, n) for g in iter_graphs(model.graph) for n in g if _is_lstm(n)]
    if infer and any((_static_dims(n.inputs[0]) or [None])[0] is None for _, n in found):
        _infer_static_shapes(model)
    count = 0
    rewriters: dict[int, _Rewriter] = {}
    for graph, node in found:
        rewriter = rewriters.setdefault(id(graph), _Rewriter(graph, opset))
        if _Unrolled(rewriter, node).build():
            count += 1
    return count


def _small_constant_of_shape(node: ir.Node) -> bool | None:
    """Fold ConstantOfShape when its output is small (onnxscript keeps every one by default, which
    leaves pads and shapes computed from one unknown, e.g. Silero's STFT padding before its LSTM)."""
    if node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
        shape = const_array(node.inputs[0]) if node.inputs else None
        if shape is not None and int(np.prod(shape)) <= _SMALL:
            return True
    return None


def _infer_static_shapes(model: ir.Model) -> None:
    from onnxscript.optimizer import fold_constants

    try:
        fold_constants(model, onnx_shape_inference=True, should_fold=_small_constant_of_shape)
        common_passes.ShapeInferencePass(strict_mode=False)(model)
    except Exception:  # noqa: BLE001 - nodes whose X shape stays unknown are left for the backend
        pass


def _string_attr(node: ir.Node, name: str, default: str) -> str:
    attr = node.attributes.get(name)
    if attr is None:
        return default
    value = attr.value
    return value.decode() if isinstance(value, bytes) else str(value)


class _Unrolled:
    """The standard-op graph of one DynamicQuantizeLSTM node."""

    def __init__(self, rewriter: _Rewriter, node: ir.Node):
        self.rw, self.em, self.node = rewriter, rewriter.em, node
        self.name = node.name or "DynamicQuantizeLSTM"

    # -- reading the node ------------------------------------------------------------------------

    def _read(self) -> bool:
        node = self.node
        hidden = node.attributes.get("hidden_size")
        direction = _string_attr(node, "direction", "forward")
        input_forget = node.attributes.get("input_forget")
        if hidden is None or direction not in ("forward", "reverse", "bidirectional"):
            return False
        self.input_forget = input_forget is not None and bool(input_forget.as_int())
        self.hidden = hidden.as_int()
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        names = node.attributes.get("activations")
        names = list(names.as_strings()) if names is not None else _DEFAULT_ACTIVATIONS * len(self.directions)
        if len(names) != 3 * len(self.directions) or any(n.lower() not in _ACTIVATIONS for n in names):
            return False
        self.activations = [_ACTIVATIONS[n.lower()] for n in names]
        clip = node.attributes.get("clip")
        self.clip = None if clip is None else clip.as_float()

        dims = _static_dims(node.inputs[0])
        if dims is None or len(dims) != 3 or dims[0] is None:
            return False
        self.steps, self.batch = dims[0], dims[1]
        self.w, self.r = const_array(node.inputs[1]), const_array(node.inputs[2])
        params = [const_array(_input(node, i)) for i in (8, 9, 10, 11)]
        if self.w is None or self.r is None or any(p is None for p in params):
            return False
        if self.w.dtype not in (np.int8, np.uint8) or self.r.dtype not in (np.int8, np.uint8):
            return False
        n_dir, four_h = len(self.directions), 4 * self.hidden
        if self.w.ndim != 3 or self.w.shape[0] != n_dir or self.w.shape[2] != four_h:
            return False
        if self.r.shape != (n_dir, self.hidden, four_h):
            return False
        self.w_scale, self.w_zero, self.r_scale, self.r_zero = params
        for p in params:
            if p.shape not in ((n_dir,), (n_dir, four_h)):
                return False
        if self.w_zero.dtype != self.w.dtype or self.r_zero.dtype != self.r.dtype:
            return False

        bias = _input(node, 3)
        self.bias = None if bias is None else const_array(bias)
        if bias is not None and (self.bias is None or self.bias.shape != (n_dir, 2 * four_h)):
            return False
        peephole = _input(node, 7)
        self.peephole = None if peephole is None else const_array(peephole)
        if peephole is not None and (self.peephole is None or self.peephole.shape != (n_dir, 3 * self.hidden)):
            return False
        lengths = _input(node, 4)
        if lengths is not None:
            values = const_array(lengths)
            if values is None or np.any(values != self.steps):
                return False
        self.initial_h, self.initial_c = _input(node, 5), _input(node, 6)
        if self.batch is None and (self.initial_h is None or self.initial_c is None):
            return False  # the zero initial state needs a static batch
        return True

    # -- small builders --------------------------------------------------------------------------

    def _int64(self, values, tag: str) -> ir.Value:
        return self.em.const(np.asarray(values, np.int64), f"{self.name}_{tag}")

    def _float(self, values, tag: str) -> ir.Value:
        return self.em.const(np.asarray(values, np.float32), f"{self.name}_{tag}")

    def _op(self, op_type: str, inputs, tag: str, attributes: dict | None = None) -> ir.Value:
        value = self.em.op(op_type, inputs, attributes, name=f"{self.name}_{tag}")
        value.dtype = ir.DataType.FLOAT
        return value

    def _gate(self, gates: ir.Value, k: int, tag: str) -> ir.Value:
        """The k-th H-wide block of the [batch, 4H] gate pre-activations."""
        h = self.hidden
        if self.em.opset >= 10:
            return self._op("Slice", [gates, self._int64([k * h], f"{tag}_start"), self._int64([(k + 1) * h], f"{tag}_end"),
                                      self._int64([1], f"{tag}_axes")], tag)
        return self._op("Slice", [gates], tag, {"starts": [k * h], "ends": [(k + 1) * h], "axes": [1]})

    def _clip(self, x: ir.Value, tag: str) -> ir.Value:
        if self.clip is None:
            return x
        if self.em.opset >= 11:
            return self._op("Clip", [x, self._float(-self.clip, f"{tag}_min"), self._float(self.clip, f"{tag}_max")], tag)
        return self._op("Clip", [x], tag, {"min": -self.clip, "max": self.clip})

    def _direction_state(self, initial: ir.Value | None, d: int, tag: str) -> ir.Value:
        """[batch, H] initial state of direction d (zeros when the input is absent)."""
        if initial is None:
            return self._float(np.zeros((self.batch, self.hidden)), tag)
        return self._op("Gather", [initial, self._int64(d, f"{tag}_index")], tag, {"axis": 0})

    def _weight(self, data: np.ndarray, scale: np.ndarray, zero: np.ndarray, d: int, tag: str) -> ir.Value | None:
        """DequantizeLinear of direction d's [K, 4H] weight; scales per tensor or per gate column."""
        return self.rw.weight(_Weight(np.ascontiguousarray(data[d]), 1, 2, -1), np.asarray(scale[d]), np.asarray(zero[d]),
                              f"{self.name}_{tag}")

    # -- the recurrence --------------------------------------------------------------------------

    def build(self) -> bool:
        if not self._read():
            return False
        outputs = list(self.node.outputs) + [None] * (3 - len(self.node.outputs))
        wanted = [v is not None and (bool(v.uses()) or v.is_graph_output()) for v in outputs]
        x = self.rw.dynamic_activation(self.node.inputs[0], f"{self.name}_x")
        sequences, last_h, last_c = [], [], []
        for d, direction in enumerate(self.directions):
            hs, h, c = self._direction(x, d, direction)
            if wanted[0]:
                steps = [self.em.unsqueeze(state, [0, 1], f"{self.name}_d{d}_t{t}_y") for t, state in enumerate(hs)]
                sequences.append(self._op("Concat", steps, f"d{d}_y", {"axis": 0}))
            last_h.append(self.em.unsqueeze(h, [0], f"{self.name}_d{d}_y_h"))
            last_c.append(self.em.unsqueeze(c, [0], f"{self.name}_d{d}_y_c"))
        results = [
            (sequences[0] if len(sequences) == 1 else self._op("Concat", sequences, "y", {"axis": 1})) if wanted[0] else None,
            last_h[0] if len(last_h) == 1 else self._op("Concat", last_h, "y_h", {"axis": 0}),
            last_c[0] if len(last_c) == 1 else self._op("Concat", last_c, "y_c", {"axis": 0}),
        ]
        self.em.flush(self.node)
        for old, new, keep in zip(outputs, results, wanted):
            if keep:
                replace_output(self.rw.graph, old, new)
        self.rw.graph.remove(self.node, safe=True)
        return True

    def _direction(self, x: ir.Value, d: int, direction: str):
        """(hidden state per step in time order, last hidden state, last cell state) of direction d."""
        h_size, tag = self.hidden, f"d{d}"
        w = self._weight(self.w, self.w_scale, self.w_zero, d, f"{tag}_w")
        r = self._weight(self.r, self.r_scale, self.r_zero, d, f"{tag}_r")
        if w is None or r is None:  # _read checked the shapes and types this needs
            raise ValueError(f"{self.name}: unexpected weight quantisation parameters")
        f_act, g_act, h_act = self.activations[3 * d: 3 * d + 3]
        projected = self._op("MatMul", [x, w], f"{tag}_x_w")  # [steps, batch, 4H], one GEMM as onnxruntime
        if self.bias is not None:
            fused = self.bias[d, : 4 * h_size] + self.bias[d, 4 * h_size:]
            projected = self._op("Add", [projected, self._float(fused, f"{tag}_bias")], f"{tag}_x_w_b")
        peep = None
        if self.peephole is not None:
            peep = [self._float(self.peephole[d, k * h_size:(k + 1) * h_size], f"{tag}_p{k}") for k in range(3)]
        h = self._direction_state(self.initial_h, d, f"{tag}_h0")
        c = self._direction_state(self.initial_c, d, f"{tag}_c0")
        order = range(self.steps) if direction == "forward" else range(self.steps - 1, -1, -1)
        hs: dict[int, ir.Value] = {}
        for t in order:
            s = f"{tag}_t{t}"
            step_x = self._op("Gather", [projected, self._int64(t, f"{s}_index")], f"{s}_x", {"axis": 0})
            h_float = self.rw.dynamic_activation(h, f"{self.name}_{s}_h")
            gates = self._op("Add", [step_x, self._op("MatMul", [h_float, r], f"{s}_h_r")], f"{s}_gates")
            i, o, f, g = (self._gate(gates, k, f"{s}_{n}") for k, n in enumerate("iofg"))
            if peep is not None:
                i = self._op("Add", [i, self._op("Mul", [peep[0], c], f"{s}_pi")], f"{s}_i_p")
                f = self._op("Add", [f, self._op("Mul", [peep[2], c], f"{s}_pf")], f"{s}_f_p")
            i = self._op(f_act, [self._clip(i, f"{s}_i_clip")], f"{s}_i_act")
            if self.input_forget:  # coupled gates: f = 1 - i
                f = self._op("Sub", [self._float(1.0, f"{s}_one"), i], f"{s}_f_act")
            else:
                f = self._op(f_act, [self._clip(f, f"{s}_f_clip")], f"{s}_f_act")
            g = self._op(g_act, [self._clip(g, f"{s}_g_clip")], f"{s}_g_act")
            c = self._op("Add", [self._op("Mul", [f, c], f"{s}_keep"), self._op("Mul", [i, g], f"{s}_write")],
                         f"{s}_c")
            if peep is not None:
                o = self._op("Add", [o, self._op("Mul", [peep[1], c], f"{s}_po")], f"{s}_o_p")
            o = self._op(f_act, [self._clip(o, f"{s}_o_clip")], f"{s}_o_act")
            h = self._op("Mul", [o, self._op(h_act, [c], f"{s}_c_act")], f"{s}_h")
            hs[t] = h
        return [hs[t] for t in range(self.steps)], h, c


@dataclass
class DecomposeDynamicQuantizedLSTM:
    """The registered pass for the LSTMs the first one could not unroll (``edgebuild.protocols.GraphPass``).

    The unrolling needs X's static sequence length, which the graph often only shows after constant
    folding (pads and shapes computed in front of the LSTM): this runs after folding, first of the
    passes there. It finds no weight to expand: DynamicQuantizeLSTM's int8 inputs are not folded.
    """

    name: str = "decompose_dynamic_quant_lstm"
    description: str = (
        "DynamicQuantizeLSTM whose sequence length is only known after constant folding -> "
        "unrolled steps with DequantizeLinear of the int8 weights and of the run-time quantised "
        "input and hidden state"
    )
    default: bool = True
    before_folding: bool = False
    min_opset: int | None = None

    def apply(self, model: ir.Model) -> int:
        count = decompose_all(model, infer=True)
        if count:
            common_passes.RemoveUnusedNodesPass()(model)
        return count


PASS = DecomposeDynamicQuantizedLSTM()
