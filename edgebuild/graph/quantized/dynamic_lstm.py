"""com.microsoft ``DynamicQuantizeLSTM`` -> an LSTM unrolled over its static sequence in standard ops.

What onnxruntime's CPU kernel computes (dynamic_quantize_lstm.cc, then the shared LSTM code of
uni_directional_lstm.cc and the quantised ComputeGemm of rnn_helpers.cc), per direction:

- the input projection X @ W is one GEMM over the steps the batch's longest row reaches: X is
  quantised once to uint8 with the DynamicQuantizeLinear rule (range including 0, scale
  (max - min) / 255, zero point rounded half to even), the product is summed in int32 and scaled
  once by x_scale * W_scale (per column of W when W_scale is per channel);
- every step quantises the previous hidden state (the whole batch at once) the same way, and its
  int32 product with R, scaled once by h_scale * R_scale, is added to the step's projection;
- then, per gate (order i, o, f, c): the peephole term, the fused bias Wb + Rb, clip, the
  activation; c = c_prev * f + i * g; h = o * h_act(c).
- the reverse direction reverses each batch row's first sequence_lens[b] steps
  (ReverseSequence), runs forward and reverses its outputs back; steps at or past a row's length
  leave that row's state as it was and write zeros to Y; Y_h / Y_c hold each row's state at its
  last valid step (zeros for length 0). Where Y is an output, a finished row's zeros are what
  the next step quantises as that row's hidden state; without Y, its last state (both lie in
  the quantised range, which always includes 0, but they quantise differently).

Here the products are ``edgebuild.graph.quantized.integer``'s: the 8-bit operands as integer-valued
floats (DequantizeLinear with scale 1, the weights' stored times a power of two that keeps an fp16
sum finite), a float MatMul that is exact while partial sums stay below 2**24 (split over the
contraction where they could not), and one multiply by the scale product, in onnxruntime's order:
at fp32 every sum is onnxruntime's, bit for bit; at fp16 sums beyond 2048 round, so fp16 builds
are close, not exact. Varying lengths (constant or run-time ``sequence_lens``) become step masks
(Where) and ReverseSequence; the quantised range of X masks steps past the longest row.

Two cases differ from onnxruntime and are documented rather than refused: when onnxruntime splits
the batch across threads (batch > 4, or >= 2 with hidden size <= 256, and more than one thread)
it quantises each thread's rows of the hidden state separately (this graph quantises the whole
batch; batch 1 or one thread is exact); and onnxruntime's own x86 uint8 x int8 kernel on CPUs
without VNNI saturates pairs of products in int16 (quantize_dynamic's reduce_range avoids it).
A node this cannot unroll (X's sequence length unknown after folding, run-time weights, an
unknown activation) stays, marked with the reason, so the backend's error names it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from edgebuild.graph.declined import mark_declined
from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.quantized._emit import const_array, onnx_opset, replace_output
from edgebuild.graph.quantized.dynamic import MS_DOMAIN, _input, _Rewriter

# onnxruntime's activation names (lower case) -> (uses alpha, uses beta, default alpha, default beta)
_ACTIVATIONS = {
    "sigmoid": (False, False, 0.0, 0.0), "tanh": (False, False, 0.0, 0.0), "relu": (False, False, 0.0, 0.0),
    "affine": (True, True, 0.0, 0.0), "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 0.0, 0.0), "scaledtanh": (True, True, 0.0, 0.0),
    "hardsigmoid": (True, True, 0.2, 0.5), "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0), "softplus": (False, False, 0.0, 0.0),
}
_DEFAULT_ACTIVATIONS = ["sigmoid", "tanh", "tanh"]
_SMALL = 4096  # elements: a shape or pads tensor, never a weight


def _is_lstm(node: ir.Node) -> bool:
    return node.op_type == "DynamicQuantizeLSTM" and node.domain == MS_DOMAIN


def _static_dims(value: ir.Value | None) -> list[int | None] | None:
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in value.shape]


def decompose_all(model: ir.Model, opset: int | None = None, *, infer: bool = False, final: bool = False) -> int:
    """Rewrite every DynamicQuantizeLSTM whose sequence length is known; returns how many.

    ``infer``: run shape inference first when some X has no static sequence length (after
    constant folding, which computed pads and shapes in front of the LSTM usually need).
    ``final``: the last chance (the pass after folding): a node left is marked with the reason.
    """
    opset = onnx_opset(model) if opset is None else opset
    found = [(g, n) for g in iter_graphs(model.graph) for n in g if _is_lstm(n)]
    if infer and any((_static_dims(n.inputs[0]) or [None])[0] is None for _, n in found):
        _infer_static_shapes(model)
    count = 0
    rewriters: dict[int, _Rewriter] = {}
    for graph, node in found:
        rewriter = rewriters.setdefault(id(graph), _Rewriter(graph, opset))
        unrolled = _Unrolled(rewriter, node)
        reason = unrolled.read()
        if reason is None:
            unrolled.build()
            count += 1
        elif final:
            mark_declined(node, f"DynamicQuantizeLSTM '{unrolled.name}': {reason}")
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


def _floats_attr(node: ir.Node, name: str) -> list[float]:
    attr = node.attributes.get(name)
    return [] if attr is None else [float(v) for v in attr.as_floats()]


def _activations(names: list[str], alphas: list[float], betas: list[float]) -> list[tuple[str, float, float]]:
    """(name, alpha, beta) per activation; alpha / beta are taken in list order by the functions
    that use them (onnxruntime's rule), defaults after the list runs out."""
    alphas, betas, out = list(alphas), list(betas), []
    for name in names:
        uses_alpha, uses_beta, alpha, beta = _ACTIVATIONS[name]
        if uses_alpha and alphas:
            alpha = alphas.pop(0)
        if uses_beta and betas:
            beta = betas.pop(0)
        out.append((name, alpha, beta))
    return out


class _Unrolled:
    """The standard-op graph of one DynamicQuantizeLSTM node."""

    def __init__(self, rewriter: _Rewriter, node: ir.Node):
        self.rw, self.em, self.node = rewriter, rewriter.em, node
        self.name = node.name or "DynamicQuantizeLSTM"
        self._weights: dict[tuple, tuple[ir.Value, ir.Value, ir.Value]] = {}

    # -- reading the node ------------------------------------------------------------------------

    def read(self) -> str | None:
        """None when the node can be unrolled, else why not (naming the attribute, input or shape)."""
        node = self.node
        hidden = node.attributes.get("hidden_size")
        if hidden is None:
            return "attribute hidden_size is missing"
        direction = _string_attr(node, "direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            return f"direction {direction!r} is none of forward, reverse, bidirectional"
        layout = node.attributes.get("layout")
        if layout is not None and layout.as_int() != 0:
            return f"layout {layout.as_int()} (onnxruntime's kernel reads X as [seq, batch, input] only)"
        input_forget = node.attributes.get("input_forget")
        self.input_forget = input_forget is not None and bool(input_forget.as_int())
        self.hidden = hidden.as_int()
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        n_dir, four_h = len(self.directions), 4 * self.hidden
        names = node.attributes.get("activations")
        names = [n.lower() for n in names.as_strings()] if names is not None else _DEFAULT_ACTIVATIONS * n_dir
        unknown = [n for n in names if n not in _ACTIVATIONS]
        if unknown:
            return f"activation {unknown[0]!r} is none of {', '.join(sorted(_ACTIVATIONS))}"
        if len(names) != 3 * n_dir:
            return f"activations lists {len(names)} functions; direction {direction!r} needs {3 * n_dir}"
        self.activations = _activations(names, _floats_attr(node, "activation_alpha"),
                                        _floats_attr(node, "activation_beta"))
        clip = node.attributes.get("clip")
        self.clip = None if clip is None else clip.as_float()

        dims = _static_dims(node.inputs[0])
        if dims is None or len(dims) != 3 or dims[0] is None:
            shape = "unknown" if dims is None else [d if d is not None else "?" for d in dims]
            return (f"the sequence length of X (dim 0 of shape {shape}) is not static; pin the input's shape "
                    "in the recipe so the steps can be unrolled")
        self.steps, self.batch = dims[0], dims[1]
        self.w, self.r = const_array(node.inputs[1]), const_array(node.inputs[2])
        for label, array in (("W", self.w), ("R", self.r)):
            if array is None:
                return f"input {label} is computed at run time (a constant int8/uint8 weight is needed)"
            if array.dtype not in (np.int8, np.uint8):
                return f"input {label} has dtype {array.dtype} (int8 or uint8 expected)"
        if self.w.ndim != 3 or self.w.shape[0] != n_dir or self.w.shape[2] != four_h:
            return f"W has shape {list(self.w.shape)}, expected [{n_dir}, input_size, {four_h}]"
        if self.r.shape != (n_dir, self.hidden, four_h):
            return f"R has shape {list(self.r.shape)}, expected [{n_dir}, {self.hidden}, {four_h}]"
        params = []
        for index, label in ((8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"), (11, "R_zero_point")):
            value = const_array(_input(node, index))
            if value is None:
                return f"input {label} is missing or computed at run time"
            if value.shape not in ((n_dir,), (n_dir, four_h)):
                return f"{label} has shape {list(value.shape)}, expected [{n_dir}] or [{n_dir}, {four_h}]"
            params.append(value)
        self.w_scale, self.w_zero, self.r_scale, self.r_zero = params
        if self.w_zero.dtype != self.w.dtype or self.r_zero.dtype != self.r.dtype:
            return "a weight's zero point has another dtype than the weight"

        bias = _input(node, 3)
        self.bias = None if bias is None else const_array(bias)
        if bias is not None and (self.bias is None or self.bias.shape != (n_dir, 2 * four_h)):
            return f"input B is computed at run time or not of shape [{n_dir}, {2 * four_h}]"
        peephole = _input(node, 7)
        self.peephole = None if peephole is None else const_array(peephole)
        if peephole is not None and (self.peephole is None or self.peephole.shape != (n_dir, 3 * self.hidden)):
            return f"input P is computed at run time or not of shape [{n_dir}, {3 * self.hidden}]"
        self.lengths = _input(node, 4)
        self.constant_lengths = None if self.lengths is None else const_array(self.lengths)
        if self.constant_lengths is not None:
            if np.any(self.constant_lengths > self.steps) or np.any(self.constant_lengths < 0):
                return f"sequence_lens holds values outside [0, {self.steps}]"
            if np.all(self.constant_lengths == self.steps):
                self.lengths = self.constant_lengths = None  # every row runs every step
        self.initial_h, self.initial_c = _input(node, 5), _input(node, 6)
        if self.batch is None and (self.initial_h is None or self.initial_c is None or self.lengths is not None):
            return ("the batch size of X (dim 1) is not static, and a zero initial state or step masks need it; "
                    "pin the input's shape in the recipe")
        return None

    # -- small builders --------------------------------------------------------------------------

    def _int64(self, values, tag: str) -> ir.Value:
        return self.em.const(np.asarray(values, np.int64), f"{self.name}_{tag}")

    def _float(self, values, tag: str) -> ir.Value:
        return self.em.const(np.asarray(values, np.float32), f"{self.name}_{tag}")

    def _op(self, op_type: str, inputs, tag: str, attributes: dict | None = None,
            dtype: ir.DataType = ir.DataType.FLOAT) -> ir.Value:
        value = self.em.op(op_type, inputs, attributes, name=f"{self.name}_{tag}")
        value.dtype = dtype
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

    def _activate(self, x: ir.Value, activation: tuple[str, float, float], tag: str) -> ir.Value:
        """onnxruntime's LSTM activation functions in ai.onnx ops."""
        name, alpha, beta = activation
        simple = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "softsign": "Softsign", "softplus": "Softplus"}
        if name in simple:
            return self._op(simple[name], [x], tag)
        if name == "affine":
            scaled = self._op("Mul", [x, self._float(alpha, f"{tag}_alpha")], f"{tag}_scaled")
            return self._op("Add", [scaled, self._float(beta, f"{tag}_beta")], tag)
        if name == "scaledtanh":
            inner = self._op("Mul", [x, self._float(beta, f"{tag}_beta")], f"{tag}_inner")
            return self._op("Mul", [self._op("Tanh", [inner], f"{tag}_tanh"), self._float(alpha, f"{tag}_alpha")], tag)
        if name == "hardsigmoid":
            return self._op("HardSigmoid", [x], tag, {"alpha": alpha, "beta": beta})
        op = {"leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu", "elu": "Elu"}[name]
        return self._op(op, [x], tag, {"alpha": alpha})

    def _direction_state(self, initial: ir.Value | None, d: int, tag: str) -> ir.Value:
        """[batch, H] initial state of direction d (zeros when the input is absent)."""
        if initial is None:
            return self._float(np.zeros((self.batch, self.hidden)), tag)
        return self._op("Gather", [initial, self._int64(d, f"{tag}_index")], tag, {"axis": 0})

    def _product(self, q: ir.Value, scale: ir.Value, zero: ir.Value, weight: np.ndarray, w_scale: np.ndarray,
                 w_zero: np.ndarray, d: int, tag: str) -> ir.Value:
        """onnxruntime's quantised GEMM: the int32 sum (q - zero) . (W[d] - W_zero[d]) times scale * W_scale[d]."""
        key = (id(weight), d)
        if key not in self._weights:  # one initializer per direction's weight, shared by every step
            self._weights[key] = (
                self.em.const(np.ascontiguousarray(weight[d]), f"{self.name}_{tag}_quantized"),
                # onnxruntime reads one zero point per direction (the first; per-channel ones must all equal it)
                self.em.const(np.asarray(w_zero[d]).reshape(-1)[:1].reshape(()), f"{self.name}_{tag}_zero_point"),
                self.em.const(np.asarray(w_scale[d], np.float32), f"{self.name}_{tag}_scale"))
        data, zero_point, w_scale_d = self._weights[key]
        product = self.rw.integer_product(q, zero, data, zero_point, f"{self.name}_{tag}")
        if product is None:  # read() checked the shapes and types this needs
            raise ValueError(f"{self.name}: unexpected weight quantisation parameters")
        total, shift = product
        multiplier = self._op("Mul", [scale, self.rw.shifted(w_scale_d, shift, f"{self.name}_{tag}")],
                              f"{tag}_multiplier")
        return self._op("Mul", [total, multiplier], f"{tag}_scaled")

    # -- step masks (varying sequence lengths) ---------------------------------------------------

    def _masks(self):
        """(lengths as int64 [batch], per step a bool [batch, 1] "step < length", bool [batch, 1] "length > 0",
        bool [steps, 1, 1] "step < longest length") when lengths vary, else None."""
        if self.lengths is None:
            return None
        if self.constant_lengths is not None:
            lengths = self.constant_lengths.astype(np.int64).reshape(-1)
            steps = [self.em.const((t < lengths).reshape(-1, 1), f"{self.name}_t{t}_valid") for t in range(self.steps)]
            started = self.em.const((lengths > 0).reshape(-1, 1), f"{self.name}_started")
            reached = self.em.const((np.arange(self.steps) < lengths.max()).reshape(-1, 1, 1), f"{self.name}_reached")
            return self._int64(lengths, "lengths"), steps, started, reached
        lengths = self._op("Cast", [self.lengths], "lengths", {"to": ir.DataType.INT64}, ir.DataType.INT64)
        column = self.em.unsqueeze(lengths, [1], f"{self.name}_lengths_column")
        steps = [self._op("Less", [self._int64(t, f"t{t}"), column], f"t{t}_valid", dtype=ir.DataType.BOOL)
                 for t in range(self.steps)]
        started = self._op("Greater", [column, self._int64(0, "zero")], "started", dtype=ir.DataType.BOOL)
        longest = self._op("ReduceMax", [lengths], "longest", {"keepdims": 0}, ir.DataType.INT64)
        reached = self._op("Less", [self._int64(np.arange(self.steps).reshape(-1, 1, 1), "steps"), longest], "reached",
                           dtype=ir.DataType.BOOL)
        return lengths, steps, started, reached

    def _reverse(self, x: ir.Value, lengths: ir.Value, tag: str) -> ir.Value:
        """Each batch row's first lengths[b] steps reversed (time axis 0, batch axis 1)."""
        return self._op("ReverseSequence", [x, lengths], tag, {"time_axis": 0, "batch_axis": 1})

    # -- the recurrence --------------------------------------------------------------------------

    def build(self) -> None:
        outputs = list(self.node.outputs) + [None] * (3 - len(self.node.outputs))
        wanted = [v is not None and (bool(v.uses()) or v.is_graph_output()) for v in outputs]
        # onnxruntime writes Y (and feeds its zeros of finished rows to the next step) when the output is named
        self.writes_y = outputs[0] is not None and bool(outputs[0].name)
        masks = self._masks()
        x = self.node.inputs[0]
        if masks is not None:  # the range onnxruntime quantises: the steps the longest row reaches
            x = self._op("Where", [masks[3], x, self._float(0.0, "x_zero")], "x_reached")
        q, scale, zero = self.rw.dynamic_quantized(x, f"{self.name}_x")
        sequences, last_h, last_c = [], [], []
        for d, direction in enumerate(self.directions):
            hs, h, c = self._direction((q, scale, zero), d, direction, masks)
            if wanted[0]:
                if masks is not None and direction == "reverse":  # [steps, batch, H], reversed per row
                    steps = [self.em.unsqueeze(state, [0], f"{self.name}_d{d}_t{t}_y") for t, state in enumerate(hs)]
                    sequence = self._reverse(self._op("Concat", steps, f"d{d}_y_rows", {"axis": 0}), masks[0],
                                             f"d{d}_y_reversed")
                    sequences.append(self.em.unsqueeze(sequence, [1], f"{self.name}_d{d}_y"))
                else:
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

    def _direction(self, x, d: int, direction: str, masks):
        """(hidden state per step in time order, last hidden state, last cell state) of direction d."""
        h_size, tag = self.hidden, f"d{d}"
        # one GEMM over the whole sequence, as onnxruntime's [steps * batch, input] x [input, 4H]
        projected = self._product(*x, self.w, self.w_scale, self.w_zero, d, f"{tag}_w")
        if masks is not None and direction == "reverse":
            projected = self._reverse(projected, masks[0], f"{tag}_x_reversed")
        bias = None
        if self.bias is not None:
            fused = self.bias[d, : 4 * h_size] + self.bias[d, 4 * h_size:]  # fp32, as onnxruntime's LoadBias
            bias = [self._float(fused[k * h_size:(k + 1) * h_size], f"{tag}_b{k}") for k in range(4)]
        peep = None
        if self.peephole is not None:
            peep = [self._float(self.peephole[d, k * h_size:(k + 1) * h_size], f"{tag}_p{k}") for k in range(3)]
        h = self._direction_state(self.initial_h, d, f"{tag}_h0")
        c = self._direction_state(self.initial_c, d, f"{tag}_c0")
        fed = h  # what the next step quantises as the hidden state
        # unmasked reverse: the steps from the end; masked: the reversed rows run forward
        order = list(range(self.steps))
        if direction == "reverse" and masks is None:
            order.reverse()
        f_act, g_act, h_act = self.activations[3 * d: 3 * d + 3]
        hs: dict[int, ir.Value] = {}
        for n, t in enumerate(order):
            s = f"{tag}_t{t}"
            step_x = self._op("Gather", [projected, self._int64(t, f"{s}_index")], f"{s}_x", {"axis": 0})
            hq, h_scale, h_zero = self.rw.dynamic_quantized(fed, f"{self.name}_{s}_h")
            recurrent = self._product(hq, h_scale, h_zero, self.r, self.r_scale, self.r_zero, d, f"{s}_r")
            gates = self._op("Add", [step_x, recurrent], f"{s}_gates")
            i, o, f, g = (self._gate(gates, k, f"{s}_{name}") for k, name in enumerate("iofg"))
            if peep is not None:
                i = self._op("Add", [i, self._op("Mul", [c, peep[0]], f"{s}_pi")], f"{s}_i_p")
                f = self._op("Add", [f, self._op("Mul", [c, peep[2]], f"{s}_pf")], f"{s}_f_p")
            if bias is not None:
                i, f, g = (self._op("Add", [v, bias[k]], f"{s}_{name}_b") for v, k, name in ((i, 0, "i"), (f, 2, "f"),
                                                                                            (g, 3, "g")))
            i = self._activate(self._clip(i, f"{s}_i_clip"), f_act, f"{s}_i_act")
            if self.input_forget:  # coupled gates: f = 1 - i
                f = self._op("Sub", [self._float(1.0, f"{s}_one"), i], f"{s}_f_act")
            else:
                f = self._activate(self._clip(f, f"{s}_f_clip"), f_act, f"{s}_f_act")
            g = self._activate(self._clip(g, f"{s}_g_clip"), g_act, f"{s}_g_act")
            c_new = self._op("Add", [self._op("Mul", [c, f], f"{s}_keep"), self._op("Mul", [i, g], f"{s}_write")],
                             f"{s}_c")
            if peep is not None:
                o = self._op("Add", [o, self._op("Mul", [c_new, peep[1]], f"{s}_po")], f"{s}_o_p")
            if bias is not None:
                o = self._op("Add", [o, bias[1]], f"{s}_o_b")
            o = self._activate(self._clip(o, f"{s}_o_clip"), f_act, f"{s}_o_act")
            h_new = self._op("Mul", [self._activate(c_new, h_act, f"{s}_c_act"), o], f"{s}_h")
            if masks is None:
                h, c, fed, hs[t] = h_new, c_new, h_new, h_new
                continue
            valid = masks[1][n]
            h = self._op("Where", [valid, h_new, h], f"{s}_h_kept")
            c = self._op("Where", [valid, c_new, c], f"{s}_c_kept")
            hs[t] = self._op("Where", [valid, h_new, self._float(0.0, f"{s}_y_zero")], f"{s}_y")
            # without Y, onnxruntime's next step reads Y_h's buffer: a row's last state, zeros until its first step
            fed = hs[t] if self.writes_y else self._op("Where", [masks[2], h, self._float(0.0, f"{s}_h_zero")],
                                                       f"{s}_h_fed")
        if masks is not None:  # a row of length 0 ends with zeros
            h = self._op("Where", [masks[2], h, self._float(0.0, f"{tag}_h_zero")], f"{tag}_h_last")
            c = self._op("Where", [masks[2], c, self._float(0.0, f"{tag}_c_zero")], f"{tag}_c_last")
        return [hs[t] for t in range(self.steps)], h, c


@dataclass
class DecomposeDynamicQuantizedLSTM:
    """The registered pass for the LSTMs the first one could not unroll (``edgebuild.protocols.GraphPass``).

    The unrolling needs X's static sequence length, which the graph often only shows after constant
    folding (pads and shapes computed in front of the LSTM): this runs after folding, first of the
    passes there. It finds no weight to expand: DynamicQuantizeLSTM's int8 inputs are not folded.
    A node it still cannot unroll is marked with the reason (the backend's error names it).
    """

    name: str = "decompose_dynamic_quant_lstm"
    description: str = (
        "DynamicQuantizeLSTM whose sequence length is only known after constant folding -> "
        "unrolled steps with onnxruntime's integer products of the int8 weights and the run-time "
        "quantised input and hidden state"
    )
    default: bool = True
    before_folding: bool = False
    min_opset: int | None = None

    def apply(self, model: ir.Model) -> int:
        count = decompose_all(model, infer=True, final=True)
        if count:
            common_passes.RemoveUnusedNodesPass()(model)
        return count


PASS = DecomposeDynamicQuantizedLSTM()
