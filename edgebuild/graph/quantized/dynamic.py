"""``onnxruntime.quantization.quantize_dynamic`` graphs -> the QDQ form.

quantize_dynamic stores weights as int8/uint8 initializers and quantises activations at run
time. It spells a quantised MatMul/Conv as::

    DynamicQuantizeLinear(x) -> MatMulInteger/ConvInteger(x_q, w_q, x_zp, w_zp) -> Cast(float)
        -> Mul(x_scale * w_scale) [-> Add bias]

and, after onnxruntime's own graph fusions, as the com.microsoft ops DynamicQuantizeMatMul,
MatMulIntegerToFloat and (for LSTM) DynamicQuantizeLSTM. This pass rewrites each into::

    DynamicQuantizeLinear(x) -> DequantizeLinear(x_q, x_scale, x_zp) ┐
    DequantizeLinear(w_q, w_scale, w_zp[, axis])                     ├-> float MatMul / Conv
                                                                     ┘

which is the same arithmetic (the integer accumulation times the scale product equals the float
product of the dequantised operands, up to float rounding), keeps the weights compressed behind
DequantizeLinear (constant folding leaves it alone), and never accumulates integers in float,
where an fp16 build would overflow. An integer op whose output is used any other way is left
alone: the backend's MatMulInteger/ConvInteger lowerings compute it as ONNX specifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.quantized._emit import (
    MS_DOMAIN,
    Emitter,
    const_array,
    only_consumer,
    onnx_opset,
    replace_output,
)

_CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _is_standard(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _output_channels(array: np.ndarray, out_rank: int, out_axis: int, channels: int) -> np.ndarray | None:
    """A scale that multiplies the op's output, as a scalar or as a vector over ``out_axis``."""
    if array.size == 1:
        return array.reshape(())
    if array.ndim > out_rank:
        return None
    padded = (1,) * (out_rank - array.ndim) + tuple(array.shape)
    varying = [i for i, d in enumerate(padded) if d != 1]
    if varying != [out_axis % out_rank] or padded[varying[0]] != channels:
        return None
    return array.reshape(-1)


def _zero_point_channels(array: np.ndarray, channels: int) -> np.ndarray | None:
    """A weight zero point: one value, or one per channel (ONNX's 1-D per-column / per-output-channel form)."""
    if array.size == 1:
        return array.reshape(())
    if array.ndim == 1 and array.size == channels:
        return array
    return None


def _per_tensor(value: ir.Value | None) -> bool:
    """A runtime scale or zero point that holds one value (DynamicQuantizeLinear's are scalars)."""
    if value is None:
        return True
    array = const_array(value)
    if array is not None:
        return array.size == 1
    if value.shape is None:
        return True  # unknown: a DynamicQuantizeLinear output, by the patterns this pass accepts
    dims = list(value.shape)
    return all(isinstance(d, int) and d == 1 for d in dims)


@dataclass
class _Weight:
    """A constant int8/uint8 operand and where its channels lie."""

    data: np.ndarray
    axis: int  # the weight's channel axis (MatMul B: last; Conv W: 0)
    out_rank: int  # rank of the op's output, to read output-shaped scales
    out_axis: int  # the output axis those channels become

    @property
    def channels(self) -> int:
        return int(self.data.shape[self.axis])


class _Rewriter:
    """Rewrites the quantised ops of one graph; shares one DequantizeLinear per quantised activation."""

    def __init__(self, graph: ir.Graph, opset: int):
        self.em = Emitter(graph, opset)
        self.graph = graph
        self._activations: dict[tuple, ir.Value] = {}

    # -- operands ------------------------------------------------------------------------------

    def activation(self, x: ir.Value, scale: ir.Value, zero_point: ir.Value | None, name: str) -> ir.Value | None:
        """DequantizeLinear(x, scale, zero_point) of a runtime quantised tensor (per-tensor only)."""
        if not (_per_tensor(scale) and _per_tensor(zero_point)):
            return None
        key = (id(x), id(scale), id(zero_point))
        if key not in self._activations:
            scale = self._scalar_if_const(scale, np.float32, name + "_scale")
            if zero_point is not None:
                zero_point = self._scalar_if_const(zero_point, None, name + "_zero_point")
            self._activations[key] = self.em.dequantize(x, scale, zero_point, None, name)
        return self._activations[key]

    def _scalar_if_const(self, value: ir.Value, dtype, name: str) -> ir.Value:
        """A constant one-element parameter as a scalar (DequantizeLinear wants a scalar per-tensor)."""
        array = const_array(value)
        if array is None or array.ndim == 0:
            return value
        return self.em.const(array.reshape(()).astype(dtype or array.dtype), name)

    def dynamic_activation(self, x: ir.Value, name: str) -> ir.Value:
        """DynamicQuantizeLinear(x) -> DequantizeLinear: run-time uint8 quantisation of a float tensor."""
        key = ("dynamic", id(x))
        if key not in self._activations:
            q, scale, zero = self.em.op("DynamicQuantizeLinear", [x], outputs=3, name=name + "_quantize")
            self._activations[key] = self.em.dequantize(q, scale, zero, None, name)
        return self._activations[key]

    def weight(self, w: _Weight, scale: np.ndarray, zero_point: ir.Value | np.ndarray | None, name: str,
               source: ir.Value | None = None) -> ir.Value | None:
        """DequantizeLinear of a constant weight (``source``, else a new initializer holding ``w.data``);
        per-tensor or per-channel along ``w.axis``. None when the parameters do not fit."""
        s = _output_channels(np.asarray(scale, np.float32), w.out_rank, w.out_axis, w.channels)
        zp = zero_point if isinstance(zero_point, np.ndarray) else const_array(zero_point)
        if zero_point is None:
            z = np.zeros((), w.data.dtype)
        elif zp is None or zp.dtype != w.data.dtype:
            return None
        else:
            z = _zero_point_channels(zp, w.channels)
        if s is None or z is None:
            return None
        axis = None
        if s.ndim or z.ndim:
            axis = w.axis
            s = np.broadcast_to(s, (w.channels,))
            z = np.broadcast_to(z, (w.channels,))
        data = source if source is not None else self.em.const(w.data, name + "_quantized")
        return self.em.dequantize(data, self.em.const(s.astype(np.float32), name + "_scale"),
                                  self.em.const(z.astype(w.data.dtype), name + "_zero_point"), axis, name)

    # -- integer ops followed by Cast -> Mul -----------------------------------------------------

    def integer_op(self, node: ir.Node) -> bool:
        """MatMulInteger / ConvInteger -> Cast(float) -> Mul(scale product): dequantise the operands instead."""
        cast = only_consumer(node.outputs[0])
        if cast is None or not _is_standard(cast, "Cast"):
            return False
        to = cast.attributes.get("to")
        if to is None or to.as_int() != ir.DataType.FLOAT:
            return False
        mul = only_consumer(cast.outputs[0])
        if mul is None or not _is_standard(mul, "Mul") or len(mul.inputs) != 2:
            return False
        product = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
        if product is cast.outputs[0]:
            return False

        conv = node.op_type == "ConvInteger"
        a, b = node.inputs[0], node.inputs[1]
        a_zero, b_zero = _input(node, 2), _input(node, 3)
        name = node.name or node.outputs[0].name or node.op_type
        b_const = const_array(b)
        weight = None
        if b_const is not None and b_const.dtype in (np.int8, np.uint8) and b_const.ndim >= (3 if conv else 1):
            if conv:
                weight = _Weight(b_const, 0, b_const.ndim, 1)
            else:
                out_rank = _rank(node.outputs[0]) or max(b_const.ndim, 2)
                weight = _Weight(b_const, b_const.ndim - 1, out_rank, -1)

        operands = self._operands(node, product, a, a_zero, b, b_zero, weight, name)
        if operands is None:
            return False
        a_float, b_float = operands
        if conv:
            attributes = {k: v.value for k, v in node.attributes.items() if k in _CONV_ATTRIBUTES}
            out = self.em.op("Conv", [a_float, b_float], attributes, name=name + "_float")
        else:
            out = self.em.op("MatMul", [a_float, b_float], name=name + "_float")
        out.dtype = ir.DataType.FLOAT
        self.em.flush(mul)
        replace_output(self.graph, mul.outputs[0], out)
        self.graph.remove(mul, safe=True)
        self.graph.remove(cast, safe=True)
        self.graph.remove(node, safe=True)
        return True

    def _operands(self, node, product, a, a_zero, b, b_zero, weight, name):
        """(dequantised A, dequantised B), splitting ``product`` into A's and B's scales."""
        for a_scale, b_scale in _scale_factors(product, a, b):
            if a_scale is None:
                a_scale = self.em.const(np.array(1.0, np.float32), name + "_unit_scale")
            a_float = self.activation(a, a_scale, a_zero, name + "_a") if const_array(a) is None else None
            if a_float is None:
                continue
            if weight is not None:
                b_array = const_array(b_scale)
                if b_array is None:
                    continue
                b_float = self.weight(weight, b_array, b_zero, name + "_weight", source=b)
            else:
                b_float = self.activation(b, b_scale, b_zero, name + "_b")
            if b_float is not None:
                return a_float, b_float
        return None

    # -- com.microsoft ops -----------------------------------------------------------------------

    def dynamic_quantize_matmul(self, node: ir.Node) -> bool:
        """DynamicQuantizeMatMul(A, B, b_scale, b_zero_point?, bias?)."""
        a, b, b_scale = node.inputs[0], node.inputs[1], node.inputs[2]
        name = node.name or "DynamicQuantizeMatMul"
        b_float = self._matmul_weight(node, b, b_scale, _input(node, 3), name)
        if b_float is None:
            return False
        a_float = self.dynamic_activation(a, name + "_a")
        return self._finish_matmul(node, a_float, b_float, _input(node, 4), name)

    def matmul_integer_to_float(self, node: ir.Node) -> bool:
        """MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias?)."""
        a, b, a_scale, b_scale = node.inputs[:4]
        if a_scale is None or a_scale.dtype not in (ir.DataType.FLOAT, None):
            return False  # an fp16 scale needs ai.onnx 19's DequantizeLinear; leave it to the backend
        name = node.name or "MatMulIntegerToFloat"
        b_float = self._matmul_weight(node, b, b_scale, _input(node, 5), name)
        a_float = self.activation(a, a_scale, _input(node, 4), name + "_a")
        if a_float is None or b_float is None:
            return False
        return self._finish_matmul(node, a_float, b_float, _input(node, 6), name)

    def _matmul_weight(self, node, b, b_scale, b_zero, name) -> ir.Value | None:
        if b_scale is None or b_scale.dtype not in (ir.DataType.FLOAT, None):
            return None
        data = const_array(b)
        if data is None:
            return self.activation(b, b_scale, b_zero, name + "_b")
        scale = const_array(b_scale)
        if scale is None or data.dtype not in (np.int8, np.uint8) or data.ndim < 1:
            return None
        # b_scale / b_zero_point are per column of B: 1-D [N], read as broadcasting over the output
        return self.weight(_Weight(data, data.ndim - 1, max(data.ndim, 2), -1), scale, b_zero, name + "_weight",
                           source=b)

    def _finish_matmul(self, node, a_float, b_float, bias, name) -> bool:
        out = self.em.op("MatMul", [a_float, b_float], name=name + "_float")
        out.dtype = ir.DataType.FLOAT
        if bias is not None:
            out = self.em.op("Add", [out, bias], name=name + "_bias")
            out.dtype = ir.DataType.FLOAT
        self.em.flush(node)
        replace_output(self.graph, node.outputs[0], out)
        self.graph.remove(node, safe=True)
        return True


def _activation_scale(x: ir.Value) -> ir.Value | None:
    """The scale a runtime quantised tensor was made with, when its producer says."""
    producer = x.producer()
    if producer is None or producer.domain not in ("", "ai.onnx"):
        return None
    if producer.op_type == "DynamicQuantizeLinear" and x is producer.outputs[0]:
        return producer.outputs[1]
    if producer.op_type == "QuantizeLinear" and x is producer.outputs[0]:
        return producer.inputs[1]
    return None


def _scale_factors(product: ir.Value, a: ir.Value, b: ir.Value) -> list[tuple[ir.Value | None, ir.Value]]:
    """Candidate (A scale, B scale) pairs whose product is ``product``; None stands for 1.

    quantize_dynamic writes ``Mul(a_scale, w_scale)``, in either order; a folded constant product
    is all B's (a unit scale for A). Where an operand's producer names its scale, that decides.
    """
    if const_array(product) is not None:
        return [(None, product)]
    mul = product.producer()
    if mul is None or not _is_standard(mul, "Mul") or len(mul.inputs) != 2:
        return []
    p, q = mul.inputs
    pairs = [(p, q), (q, p)]
    known_a, known_b = _activation_scale(a), _activation_scale(b)
    if known_a is not None:
        pairs = [pair for pair in pairs if pair[0] is known_a]
    if known_b is not None:
        pairs = [pair for pair in pairs if pair[1] is known_b]
    # a constant operand is more likely the weight's scale: try it as B's first
    pairs.sort(key=lambda pair: const_array(pair[1]) is None)
    return pairs


_OPS = {
    ("", "MatMulInteger"): _Rewriter.integer_op,
    ("", "ConvInteger"): _Rewriter.integer_op,
    (MS_DOMAIN, "DynamicQuantizeMatMul"): _Rewriter.dynamic_quantize_matmul,
    (MS_DOMAIN, "MatMulIntegerToFloat"): _Rewriter.matmul_integer_to_float,
}


def _key(node: ir.Node) -> tuple[str, str]:
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


@dataclass
class DecomposeDynamicQuantization:
    """The registered pass (``edgebuild.protocols.GraphPass``)."""

    name: str = "decompose_dynamic_quant"
    description: str = (
        "quantize_dynamic's MatMulInteger/ConvInteger + scale, DynamicQuantizeMatMul, "
        "MatMulIntegerToFloat and DynamicQuantizeLSTM -> DequantizeLinear of int8 weights and of "
        "run-time quantised activations + float MatMul/Conv/LSTM steps"
    )
    default: bool = True
    before_folding: bool = True
    min_opset: int | None = None

    def apply(self, model: ir.Model) -> int:
        from edgebuild.graph.quantized import dynamic_lstm

        opset = onnx_opset(model)
        total = 0
        for graph in list(iter_graphs(model.graph)):
            rewriter = _Rewriter(graph, opset)
            for node in list(graph):
                rewrite = _OPS.get(_key(node))
                if rewrite is not None and node.graph is graph and rewrite(rewriter, node):
                    total += 1
        if any(_key(n) == (MS_DOMAIN, "DynamicQuantizeLSTM") for g in iter_graphs(model.graph) for n in g):
            total += dynamic_lstm.decompose_all(model, opset)
        if total:
            common_passes.RemoveUnusedNodesPass()(model)
        return total


PASS = DecomposeDynamicQuantization()
