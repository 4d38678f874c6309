"""QOperator ops -> the QDQ form: ``DequantizeLinear -> float op -> QuantizeLinear``.

onnxruntime's ``quantize_static(..., quant_format=QOperator)`` writes integer operators
(ai.onnx ``QLinearConv`` and ``QLinearMatMul``, com.microsoft ``QGemm``, ``QLinearAdd``, ...)
that carry their inputs' and outputs' scales and zero points. Each becomes the float op it
quantises, between a DequantizeLinear of every quantised input and a QuantizeLinear of the
result, so a backend needs only Q/DQ and the float op:

- weights (int8/uint8 initializers, per tensor or per output channel) become
  ``DequantizeLinear(w, scale, zero_point[, axis])``, which constant folding leaves alone and a
  backend keeps compressed;
- int32 biases (QLinearConv ``B``, QGemm ``C``) are stored at scale ``x_scale * w_scale``; they
  become float initializers (they are small), or ``Cast -> Mul`` when a scale is computed.

QLinearConv, QLinearMatMul and QGemm with constant scales and a constant weight take onnxruntime's
integer arithmetic instead (edgebuild.graph.quantized.integer): integer-valued operands
(``DequantizeLinear(x, 1, x_zp)``, the weight times ``2**-shift``), the int32 bias as integers, one
``Mul`` by ``x_scale * w_scale / y_scale`` (computed in float32 in that order, as onnxruntime's
kernels do, times ``2**shift``) and ``QuantizeLinear(., 1, y_zp)``, which rounds half to even and
saturates as onnxruntime's requantisation does (QGemm: ``alpha * a_scale * b_scale``, over
``y_scale`` when it requantises): at fp32 the output is onnxruntime's exactly.
QLinearGlobalAveragePool likewise sums ``x - x_zero_point`` (ReduceSum) and requantises once by
``x_scale / (y_scale * image size)``. The
other ops (and computed scales) go through float: there a requantised output can differ from
onnxruntime's by one step where the exact value sits on a rounding boundary.

Per-axis Q/DQ (``axis``) is ai.onnx opset 13; the model's opset is never raised (that would change
other ops' meaning). A model at opset 10-12 gets per-axis DequantizeLinear nodes all the same:
edgebuild's backends and reference evaluator read ``axis`` whatever the opset, and the
rewritten graph is only ever consumed by them, never handed back to another runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.quantized import integer
from edgebuild.graph.quantized._emit import MS_DOMAIN, const_array


class QOperatorError(ValueError):
    """A QOperator node the decomposition cannot express; the message names the node."""


def _where(node: ir.Node) -> str:
    domain = f"{node.domain}::" if node.domain not in ("", "ai.onnx") else ""
    return f"node {node.name or '<unnamed>'!r} ({domain}{node.op_type})"


def _static_size(value: ir.Value) -> int | None:
    if value.const_value is not None:
        return int(np.prod(list(value.const_value.shape), dtype=np.int64))
    array = const_array(value)
    if array is not None:
        return int(array.size)
    if value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return None
    return int(np.prod(list(value.shape), dtype=np.int64))


class Rewrite:
    """Builds the replacement of one node: new nodes, new initializers, unique names."""

    def __init__(self, graph: ir.Graph, node: ir.Node, taken: set[str], opset: int | None = None):
        self.graph, self.node, self.taken = graph, node, taken
        self.opset = opset  # the model's ai.onnx opset, which the emitted float ops follow
        self.nodes: list[ir.Node] = []
        self.base = node.name or (node.outputs[0].name if node.outputs else node.op_type) or node.op_type

    # -- inputs -----------------------------------------------------------------------------
    def input(self, index: int, what: str = "") -> ir.Value:
        value = self.optional(index)
        if value is None:
            self.fail(f"input {index}{f' ({what})' if what else ''} is required but missing")
        return value

    def optional(self, index: int) -> ir.Value | None:
        inputs = self.node.inputs
        value = inputs[index] if index < len(inputs) else None
        return None if value is None or value.name == "" else value

    def int_attr(self, name: str, default: int) -> int:
        attr = self.node.attributes.get(name)
        return default if attr is None else attr.as_int()

    def float_attr(self, name: str, default: float) -> float:
        attr = self.node.attributes.get(name)
        return default if attr is None else attr.as_float()

    def copied_attrs(self, *names: str) -> dict:
        """The node's attributes of these names (those it sets), for the float op."""
        return {n: self.node.attributes[n].value for n in names if n in self.node.attributes}

    def fail(self, reason: str, hint: str = "") -> None:
        raise QOperatorError(f"{_where(self.node)}: {reason}" + (f" ({hint})" if hint else ""))

    # -- building ---------------------------------------------------------------------------
    def fresh(self, suffix: str) -> str:
        name, i = f"{self.base}_{suffix}", 1
        while name in self.taken:
            i += 1
            name = f"{self.base}_{suffix}_{i}"
        self.taken.add(name)
        return name

    def op(self, op_type: str, inputs: Sequence[ir.Value | None], suffix: str, **attrs) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attrs or None, name=self.fresh(suffix))
        node.outputs[0].name = self.fresh(f"{suffix}_out")
        self.nodes.append(node)
        return node.outputs[0]

    def initializer(self, array: np.ndarray, suffix: str) -> ir.Value:
        name = self.fresh(suffix)
        array = np.ascontiguousarray(array).reshape(np.shape(array))  # keeps 0-d as 0-d
        value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        value.shape = ir.Shape(array.shape)
        value.type = ir.TensorType(value.const_value.dtype)
        self.graph.register_initializer(value)
        return value

    # -- quantisation -----------------------------------------------------------------------
    def dequantize(self, x: ir.Value, scale: ir.Value, zero: ir.Value | None, suffix: str,
                   axis: int | None = None) -> ir.Value:
        """DequantizeLinear; ``axis`` is the per-channel axis, used when the scale has more than one
        element (a one-element scale means per tensor to onnxruntime, onnx and the backends)."""
        per_axis = axis is not None and _static_size(scale) != 1
        if per_axis and zero is not None and _static_size(zero) == 1:
            zero = self._broadcast_zero(zero, scale, suffix)
        attrs = {"axis": axis} if per_axis else {}
        inputs = [x, scale] if zero is None else [x, scale, zero]
        return self.op("DequantizeLinear", inputs, f"{suffix}_dq", **attrs)

    def _broadcast_zero(self, zero: ir.Value, scale: ir.Value, suffix: str) -> ir.Value:
        """A per-tensor zero point next to a per-axis scale: DequantizeLinear wants both of one shape."""
        zero_array, scale_array = const_array(zero), const_array(scale)
        if zero_array is not None and scale_array is not None:
            return self.initializer(np.full(scale_array.shape, zero_array.reshape(()), zero_array.dtype),
                                    f"{suffix}_zero_point")
        shape = self.op("Shape", [scale], f"{suffix}_scale_shape")
        return self.op("Expand", [zero, shape], f"{suffix}_zero_point")

    def quantize(self, y: ir.Value, scale: ir.Value, zero: ir.Value | None, output: ir.Value,
                 like: ir.Value | None = None) -> ir.Value:
        """QuantizeLinear to the node's output type. Without a zero point QuantizeLinear would give
        uint8, so a zero of the output's type (or ``like``'s) is supplied."""
        if zero is None:
            dtype = output.dtype or (like.dtype if like is not None else None) or ir.DataType.UINT8
            zero = self.initializer(np.zeros((), dtype.numpy()), "y_zero_point")
        return self.op("QuantizeLinear", [y, scale, zero], "quantize")

    def int32_as_float(self, value: ir.Value, scales: Sequence[ir.Value], suffix: str,
                       factor: float = 1.0) -> ir.Value:
        """An int32 tensor stored at scale ``factor * prod(scales)`` as float: an initializer when
        every scale is constant, else Cast and Mul (which constant folding settles)."""
        data = const_array(value)
        arrays = [const_array(s) for s in scales]
        float_type = next((s.dtype for s in scales if s.dtype is not None), ir.DataType.FLOAT)
        if data is not None and all(a is not None for a in arrays):
            scale = np.float64(factor)
            for a in arrays:
                scale = scale * a.astype(np.float64)
            return self.initializer((data.astype(np.float64) * scale).astype(float_type.numpy()), suffix)
        out = self.op("Cast", [value], f"{suffix}_as_float", to=int(float_type))
        for i, s in enumerate(scales):
            out = self.op("Mul", [out, s], f"{suffix}_scaled_{i}")
        if factor != 1.0:
            out = self.op("Mul", [out, self.initializer(np.array(factor, float_type.numpy()), f"{suffix}_factor")],
                          f"{suffix}_times_factor")
        return out

    def rank_of(self, value: ir.Value, what: str) -> int:
        array = const_array(value)
        if array is not None:
            return array.ndim
        if value.shape is None:
            self.fail(f"the rank of {what} is unknown", "give the model's input shapes in the recipe's source.inputs")
        return len(value.shape)


# -- the ops --------------------------------------------------------------------------------
def _constant_scales(r: Rewrite, *indices: int) -> list[np.ndarray] | None:
    """The float32 scales at these inputs, when every one is a constant."""
    arrays = [const_array(r.optional(i)) if r.optional(i) is not None else None for i in indices]
    if any(a is None or a.dtype != np.float32 for a in arrays):
        return None
    return arrays


def _integer_weight(r: Rewrite, index: int, zero_index: int, conv: bool,
                    trans_b: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """(int8/uint8 weight, its zero point) when both are constants of one type (per tensor or per channel)."""
    data = const_array(r.optional(index))
    zero_value = r.optional(zero_index)
    zero = np.zeros((), data.dtype) if data is not None and zero_value is None else const_array(zero_value)
    if data is None or zero is None or data.dtype not in (np.int8, np.uint8) or zero.dtype != data.dtype:
        return None
    if data.ndim < (3 if conv else 2) or (trans_b and data.ndim != 2):
        return None
    if zero.size not in (1, data.shape[0 if conv or trans_b else -1]):
        return None
    return data, zero


def _integer_requantized(r: Rewrite, kind: str, x_index: int, w_index: int, scale_indices: tuple,
                         attributes: dict, bias: np.ndarray | None, *, alpha: float | None = None,
                         trans_a: bool = False, trans_b: bool = False) -> ir.Value | None:
    """onnxruntime's integer kernel: the int32 sum (plus the int32 bias) as integer-valued float32,
    times ``x_scale * w_scale / y_scale`` in that order (QGemm: ``alpha * a_scale * b_scale``
    [``/ y_scale``]), rounded half to even, shifted by the output zero point and saturated
    (QuantizeLinear with scale 1); without a y_scale index (QGemm's float output) the scaled sum.
    None when a scale is computed or the weight is not a constant (the float form then)."""
    conv = kind == "Conv"
    requantize = scale_indices[2] is not None
    scales = _constant_scales(r, *(i for i in scale_indices if i is not None))
    weight = _integer_weight(r, w_index, w_index + 2, conv, trans_b)
    x_zero = r.optional(x_index + 2)
    if scales is None or weight is None or scales[0].size != 1 or (requantize and scales[2].size != 1):
        return None
    if x_zero is not None and _static_size(x_zero) != 1:
        return None
    data, zero = weight
    if trans_b:  # QGemm's [N, K] weight as [K, N] (still 8-bit)
        data = np.ascontiguousarray(data.T)
    channels = data.shape[0 if conv else -1]
    if scales[1].size not in (1, channels):
        return None
    steps = integer.contraction_sums(data, zero, conv)
    bound = integer.EIGHT_BIT_SPAN * float(steps.sum()) + (float(np.abs(bias).max()) if bias is not None else 0.0)
    shift = integer.shift_for(bound)
    x_int = r.dequantize(r.input(x_index), _unit_scale(r, x_zero), x_zero, "x")
    if trans_a:
        x_int = r.op("Transpose", [x_int], "a_transposed", perm=[1, 0])
    step_axis = 1 if conv else data.ndim - 2
    weight_scale = np.full(channels if zero.size > 1 else (), 2.0 ** -shift, np.float32)
    channel_axis = 0 if conv else data.ndim - 1

    def weight_part(start: int, end: int) -> ir.Value:
        part = data if (start, end) == (0, len(steps)) else np.take(data, np.arange(start, end), axis=step_axis)
        source = r.input(w_index) if part is data and not trans_b else r.initializer(part, "w_part")
        return r.dequantize(source, r.initializer(weight_scale, "w_integer_scale"),
                            r.initializer(zero, "w_zero_point") if np.any(zero) else None,
                            "w", axis=channel_axis)

    bias_value = None
    if bias is not None:
        bias_value = r.initializer((bias.astype(np.float64) * 2.0 ** -shift).astype(np.float32), "bias_integer")
    grouped = conv and int(attributes.get("group", 1)) != 1
    runs = [(0, len(steps))] if grouped else integer.chunks(steps, integer.EIGHT_BIT_SPAN)
    total = integer.chunked_product(lambda op, inputs, attrs: r.op(op, inputs, op.lower(), **attrs),
                                    lambda array: r.initializer(array, "slice"), kind, x_int, weight_part, runs,
                                    1 if conv else -1, attributes, bias_value if conv else None)
    if bias_value is not None and kind != "Conv":
        total = r.op("Add", [total, bias_value], "bias")
    x_scale, w_scale = (a.astype(np.float32).reshape(-1) for a in scales[:2])
    if alpha is not None:
        x_scale = (np.float32(alpha) * x_scale).astype(np.float32)
    multiplier = (x_scale * w_scale).astype(np.float32)
    if requantize:
        multiplier = (multiplier / scales[2].astype(np.float32).reshape(())).astype(np.float32)
    multiplier = (multiplier * np.float32(2.0 ** shift)).astype(np.float32)  # exact: a power of two
    if multiplier.size == 1:
        multiplier = multiplier.reshape(())
    elif conv:
        multiplier = multiplier.reshape([-1] + [1] * (data.ndim - 2))
    scaled = r.op("Mul", [total, r.initializer(multiplier, "multiplier")], "requantize")
    if not requantize:
        return scaled
    y_zero = r.optional(scale_indices[2] + 1)
    return r.quantize(scaled, _unit_scale(r, y_zero), y_zero, r.node.outputs[0], like=r.input(x_index))


def _unit_scale(r: Rewrite, zero: ir.Value | None) -> ir.Value:
    """A scale of 1 shaped like ``zero`` (Q/DQ want a per-tensor scale and zero point of one shape)."""
    shape = () if zero is None or zero.shape is None else tuple(zero.shape)
    return r.initializer(np.ones(shape if all(isinstance(d, int) for d in shape) else (), np.float32), "unit_scale")


def _conv(r: Rewrite) -> ir.Value:
    """QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, B])."""
    attributes = r.copied_attrs("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    bias = const_array(r.optional(8)) if r.optional(8) is not None else None
    if r.optional(8) is None or bias is not None:
        exact = _integer_requantized(r, "Conv", 0, 3, (1, 4, 6), attributes, bias)
        if exact is not None:
            return exact
    x = r.dequantize(r.input(0, "x"), r.input(1, "x_scale"), r.optional(2), "x")
    w = r.dequantize(r.input(3, "w"), r.input(4, "w_scale"), r.optional(5), "w", axis=0)
    inputs = [x, w]
    if r.optional(8) is not None:  # int32 bias at scale x_scale * w_scale (per output channel)
        inputs.append(r.int32_as_float(r.input(8), [r.input(1), r.input(4)], "bias"))
    y = r.op("Conv", inputs, "conv", **attributes)
    return r.quantize(y, r.input(6, "y_scale"), r.optional(7), r.node.outputs[0], like=r.input(0))


def _matmul(r: Rewrite) -> ir.Value:
    """QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp): a per row, b per column."""
    exact = _integer_requantized(r, "MatMul", 0, 3, (1, 4, 6), {}, None)
    if exact is not None:
        return exact
    a_in, b_in = r.input(0, "a"), r.input(3, "b")
    a = r.dequantize(a_in, r.input(1, "a_scale"), r.optional(2), "a", axis=-2)
    b = r.dequantize(b_in, r.input(4, "b_scale"), r.optional(5), "b", axis=-1)
    y = r.op("MatMul", [a, b], "matmul")
    return r.quantize(y, r.input(6, "y_scale"), r.optional(7), r.node.outputs[0], like=a_in)


def _gemm(r: Rewrite) -> ir.Value:
    """com.microsoft QGemm(A, a_scale, a_zp, B, b_scale, b_zp[, C][, y_scale][, y_zp]).

    B is per tensor or per column of the product; C is int32 at scale alpha * a_scale * b_scale;
    without y_scale the output is float.
    """
    trans_b = r.int_attr("transB", 0)
    alpha = r.float_attr("alpha", 1.0)
    bias = const_array(r.optional(6)) if r.optional(6) is not None else None
    # onnxruntime requantises when y_zero_point is given, else writes the scaled float sum
    float_output = r.optional(7) is None and r.optional(8) is None
    if (r.optional(6) is None or bias is not None) and (float_output or r.optional(8) is not None):
        exact = _integer_requantized(r, "MatMul", 0, 3, (1, 4, None if float_output else 7), {}, bias, alpha=alpha,
                                     trans_a=bool(r.int_attr("transA", 0)), trans_b=bool(trans_b))
        if exact is not None:
            return exact
    a_in = r.input(0, "A")
    a = r.dequantize(a_in, r.input(1, "a_scale"), r.optional(2), "a")
    b = r.dequantize(r.input(3, "B"), r.input(4, "b_scale"), r.optional(5), "b", axis=0 if trans_b else 1)
    inputs = [a, b]
    if r.optional(6) is not None:
        inputs.append(r.int32_as_float(r.input(6), [r.input(1), r.input(4)], "c", factor=alpha))
    y = r.op("Gemm", inputs, "gemm", alpha=alpha, transA=r.int_attr("transA", 0), transB=trans_b)
    if r.optional(7) is None:
        return y
    return r.quantize(y, r.input(7), r.optional(8), r.node.outputs[0], like=a_in)


def _binary(op_type: str) -> Callable[[Rewrite], ir.Value]:
    def rewrite(r: Rewrite) -> ir.Value:
        """QLinearAdd / QLinearMul(A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp), broadcasting."""
        a_in = r.input(0, "A")
        a = r.dequantize(a_in, r.input(1, "A_scale"), r.optional(2), "a")
        b = r.dequantize(r.input(3, "B"), r.input(4, "B_scale"), r.optional(5), "b")
        y = r.op(op_type, [a, b], op_type.lower())
        return r.quantize(y, r.input(6, "C_scale"), r.optional(7), r.node.outputs[0], like=a_in)

    return rewrite


def _unary(op_type: str, **attrs: Callable[[Rewrite], object]) -> Callable[[Rewrite], ir.Value]:
    def rewrite(r: Rewrite) -> ir.Value:
        """QLinearSigmoid / QLinearLeakyRelu(X, X_scale, X_zp, Y_scale, Y_zp)."""
        x_in = r.input(0, "X")
        x = r.dequantize(x_in, r.input(1, "X_scale"), r.optional(2), "x")
        y = r.op(op_type, [x], op_type.lower(), **{k: f(r) for k, f in attrs.items()})
        return r.quantize(y, r.input(3, "Y_scale"), r.optional(4), r.node.outputs[0], like=x_in)

    return rewrite


def _concat(r: Rewrite) -> ir.Value:
    """QLinearConcat(Y_scale, Y_zp, X0, X0_scale, X0_zp, X1, ...)."""
    rest = list(r.node.inputs[2:])
    if not rest or len(rest) % 3:
        r.fail(f"expected (tensor, scale, zero point) triples after Y_scale and Y_zero_point, got {len(rest)} inputs")
    parts = [r.dequantize(r.input(2 + 3 * i, "tensor"), r.input(3 + 3 * i, "scale"), r.optional(4 + 3 * i), f"x{i}")
             for i in range(len(rest) // 3)]
    y = r.op("Concat", parts, "concat", axis=r.int_attr("axis", 0))
    return r.quantize(y, r.input(0, "Y_scale"), r.optional(1), r.node.outputs[0], like=r.input(2))


def _channels_first(r: Rewrite, x: ir.Value, x_in: ir.Value) -> tuple[ir.Value, list[int] | None]:
    """NHWC input (``channels_last=1``) transposed to NCHW, and the permutation back."""
    if not r.int_attr("channels_last", 0):
        return x, None
    rank = r.rank_of(x_in, "X")
    to_first = [0, rank - 1, *range(1, rank - 1)]
    back = [0, *range(2, rank), 1]
    return r.op("Transpose", [x], "to_channels_first", perm=to_first), back


def _pool(op_type: str, *copied: str) -> Callable[[Rewrite], ir.Value]:
    def rewrite(r: Rewrite) -> ir.Value:
        """QLinearGlobalAveragePool / QLinearAveragePool(X, x_scale, x_zp, y_scale, y_zp), NCHW or NHWC."""
        x_in = r.input(0, "X")
        x, back = _channels_first(r, r.dequantize(x_in, r.input(1, "x_scale"), r.optional(2), "x"), x_in)
        y = r.op(op_type, [x], op_type.lower(), **r.copied_attrs(*copied))
        if back is not None:
            y = r.op("Transpose", [y], "to_channels_last", perm=back)
        return r.quantize(y, r.input(3, "y_scale"), r.optional(4), r.node.outputs[0], like=x_in)

    return rewrite


def _global_average_pool(r: Rewrite) -> ir.Value:
    """QLinearGlobalAveragePool as onnxruntime's kernel: the int32 sum of ``x - x_zero_point`` over
    the image, times ``x_scale / (y_scale * image size)``, requantised once. Computed scales or an
    unknown image size take the float form."""
    x_in = r.input(0, "X")
    scales = _constant_scales(r, 1, 3)
    x_zero = r.optional(2)
    dims = list(x_in.shape) if x_in.shape is not None else None
    if scales is None or dims is None or len(dims) < 3 or not all(isinstance(d, int) for d in dims) \
            or any(a.size != 1 for a in scales) or (x_zero is not None and _static_size(x_zero) != 1):
        return _pool("GlobalAveragePool")(r)
    channels_last = bool(r.int_attr("channels_last", 0))
    axes = list(range(1, len(dims) - 1)) if channels_last else list(range(2, len(dims)))
    size = int(np.prod([dims[a] for a in axes]))
    x_int = r.dequantize(x_in, _unit_scale(r, x_zero), x_zero, "x")
    if r.opset is not None and r.opset >= 13:
        total = r.op("ReduceSum", [x_int, r.initializer(np.array(axes, np.int64), "axes")], "sum", keepdims=1)
    else:
        total = r.op("ReduceSum", [x_int], "sum", axes=axes, keepdims=1)
    x_scale, y_scale = (a.astype(np.float32).reshape(()) for a in scales)
    multiplier = (x_scale / (y_scale * np.float32(size))).astype(np.float32)
    scaled = r.op("Mul", [total, r.initializer(multiplier, "multiplier")], "requantize")
    y_zero = r.optional(4)
    return r.quantize(scaled, _unit_scale(r, y_zero), y_zero, r.node.outputs[0], like=x_in)


def _softmax(r: Rewrite) -> ir.Value:
    """com.microsoft QLinearSoftmax(X, X_scale, x_zp, y_scale, y_zp); ``opset`` says which Softmax it
    quantises: before 13 the input is flattened to 2-D at ``axis`` (default 1), from 13 one axis
    (default -1). The float Softmax follows the model's opset, so the two must agree, unless the
    axis is the last one, where both mean the same."""
    x_in = r.input(0, "X")
    op_opset = r.int_attr("opset", 13)
    axis = r.int_attr("axis", 1 if op_opset < 13 else -1)
    last = axis == -1 or (x_in.shape is not None and axis == len(x_in.shape) - 1)
    if not last and (r.opset is None or (op_opset < 13) != (r.opset < 13)):
        r.fail(f"a softmax of opset {op_opset} over axis {axis} cannot be written at the model's opset {r.opset}",
               "export the model with the softmax over the last axis")
    x = r.dequantize(x_in, r.input(1, "X_scale"), r.optional(2), "x")
    y = r.op("Softmax", [x], "softmax", axis=axis)
    return r.quantize(y, r.input(3, "y_scale"), r.optional(4), r.node.outputs[0], like=x_in)


REWRITES: dict[tuple[str, str], Callable[[Rewrite], ir.Value]] = {
    ("", "QLinearConv"): _conv,
    ("", "QLinearMatMul"): _matmul,
    (MS_DOMAIN, "QGemm"): _gemm,
    (MS_DOMAIN, "QLinearAdd"): _binary("Add"),
    (MS_DOMAIN, "QLinearMul"): _binary("Mul"),
    (MS_DOMAIN, "QLinearSigmoid"): _unary("Sigmoid"),
    (MS_DOMAIN, "QLinearLeakyRelu"): _unary("LeakyRelu", alpha=lambda r: r.float_attr("alpha", 0.01)),
    (MS_DOMAIN, "QLinearConcat"): _concat,
    (MS_DOMAIN, "QLinearSoftmax"): _softmax,
    (MS_DOMAIN, "QLinearGlobalAveragePool"): _global_average_pool,
    (MS_DOMAIN, "QLinearAveragePool"): _pool(
        "AveragePool", "auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"),
}


def _key(node: ir.Node) -> tuple[str, str]:
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


def _names_in(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    for node in graph:
        if node.name:
            names.add(node.name)
        names.update(o.name for o in node.outputs if o.name)
    return names


def rewrite_graph(graph: ir.Graph, opset: int | None = None) -> int:
    """Rewrite every QOperator node of ``graph`` (not its subgraphs) in place; returns how many.
    ``opset``: the model's ai.onnx opset."""
    targets = [node for node in graph if _key(node) in REWRITES]
    if not targets:
        return 0
    taken = _names_in(graph)
    for node in targets:
        rewrite = Rewrite(graph, node, taken, opset)
        result = REWRITES[_key(node)](rewrite)
        ir.convenience.replace_nodes_and_values(graph, node, [node], rewrite.nodes, [node.outputs[0]], [result])
    return len(targets)


class DecomposeQOperator:
    """The graph pass (``edgebuild.protocols.GraphPass``) over the model and its subgraphs."""

    name = "decompose_qoperator"
    description = ("QLinearConv, QLinearMatMul and com.microsoft QGemm/QLinearAdd/Mul/Sigmoid/LeakyRelu/"
                   "Softmax/Concat/(Global)AveragePool -> DequantizeLinear -> float op -> QuantizeLinear")
    default = True
    before_folding = True
    min_opset = None

    def apply(self, model: ir.Model) -> int:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        return sum(rewrite_graph(graph, opset) for graph in list(iter_graphs(model.graph)))


PASS = DecomposeQOperator()


def supported_ops() -> list[str]:
    """``domain::Op`` names (plain for ai.onnx) of the ops this pass rewrites."""
    return [f"{d}::{op}" if d else op for d, op in REWRITES]
