"""``onnxruntime.quantization.quantize_dynamic`` graphs -> the QDQ form.

quantize_dynamic stores weights as int8/uint8 initializers and quantises activations at run
time. It spells a quantised MatMul/Conv as::

    DynamicQuantizeLinear(x) -> MatMulInteger/ConvInteger(x_q, w_q, x_zp, w_zp) -> Cast(float)
        -> Mul(x_scale * w_scale) [-> Add bias]

and, after onnxruntime's own graph fusions, as the com.microsoft ops DynamicQuantizeMatMul,
MatMulIntegerToFloat and (for LSTM) DynamicQuantizeLSTM. This pass rewrites each matmul/conv into
the same integer arithmetic in standard float ops (edgebuild.graph.quantized.integer)::

    DynamicQuantizeLinear(x) -> DequantizeLinear(x_q, 1, x_zp)                 ┐
    DequantizeLinear(w_q, 2**-shift, w_zp[, axis])                             ├-> MatMul / Conv
                                                                               ┘   -> Mul(scale * 2**shift)

The operands are the integers ``q - zero point`` as floats, so the float MatMul/Conv sums exactly
what onnxruntime's int32 kernel sums (split over the contraction where it could pass 2**24), and
the one multiply by the graph's own scale product rounds as onnxruntime's ``Cast -> Mul`` does:
at fp32 the result is onnxruntime's bit for bit. ``shift`` keeps the worst-case sum within fp16's
range, so one graph also serves an fp16 build (there the sum is rounded to fp16 and agreement
with onnxruntime is approximate). The weights stay int8/uint8 behind DequantizeLinear (constant
folding leaves it alone). An integer op whose output is used any other way is left alone: the
backend's MatMulInteger/ConvInteger lowerings compute it as ONNX specifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.quantized import integer
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
            q, scale, zero = self.dynamic_quantized(x, name)
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

    def unit_scale(self, shift: int = 0) -> ir.Value:
        """The constant scale ``2**-shift`` (one per graph and shift, so activations are shared)."""
        key = ("unit", shift)
        if key not in self._activations:
            self._activations[key] = self.em.const(np.array(2.0 ** -shift, np.float32), f"integer_scale_{shift}")
        return self._activations[key]

    def integer_op(self, node: ir.Node) -> bool:
        """MatMulInteger / ConvInteger -> Cast(float) -> Mul(scale): the same sum on integer-valued floats."""
        cast = only_consumer(node.outputs[0])
        if cast is None or not _is_standard(cast, "Cast"):
            return False
        to = cast.attributes.get("to")
        if to is None or to.as_int() != ir.DataType.FLOAT:
            return False
        mul = only_consumer(cast.outputs[0])
        if mul is None or not _is_standard(mul, "Mul") or len(mul.inputs) != 2:
            return False
        scale = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
        if scale is cast.outputs[0]:
            return False
        conv = node.op_type == "ConvInteger"
        attributes = {k: v.value for k, v in node.attributes.items() if k in _CONV_ATTRIBUTES} if conv else {}
        name = node.name or node.outputs[0].name or node.op_type
        product = self.integer_product(node.inputs[0], _input(node, 2), node.inputs[1], _input(node, 3), name,
                                       conv=conv, attributes=attributes)
        if product is None:
            return False
        self._finish(mul, product, scale, None, name)
        self.graph.remove(cast, safe=True)
        self.graph.remove(node, safe=True)
        return True

    def integer_product(self, a: ir.Value, a_zero: ir.Value | None, b: ir.Value, b_zero: ir.Value | None,
                        name: str, *, conv: bool = False, attributes: dict | None = None,
                        bias: np.ndarray | None = None) -> tuple[ir.Value, int] | None:
        """(the integer sum ``(a - a_zero) . (b - b_zero)`` as float32, times ``2**-shift``; ``shift``).

        A is run-time (per-tensor zero point); B a constant int8/uint8 weight (per tensor or per
        channel) or run-time too. ``bias``: an integer-valued bias added to the sum (QLinearConv's).
        None when the operands do not fit.
        """
        b_data = const_array(b)
        a_int = self.activation(a, self.unit_scale(), a_zero, name + "_a") if const_array(a) is None else None
        if a_int is None:
            return None
        steps = None
        if b_data is not None and b_data.dtype in (np.int8, np.uint8) and b_data.ndim >= (3 if conv else 2):
            zero = np.zeros((), b_data.dtype) if b_zero is None else const_array(b_zero)
            channels = b_data.shape[0 if conv else -1]
            if zero is None or zero.dtype != b_data.dtype or _zero_point_channels(zero, channels) is None:
                return None
            steps = integer.contraction_sums(b_data, zero, conv)
            bound = integer.EIGHT_BIT_SPAN * float(steps.sum())
        else:
            if conv:
                return None  # a run-time filter: left to the backend's ConvInteger lowering
            k = b.shape[-2] if b.shape is not None and len(b.shape) >= 2 and isinstance(b.shape[-2], int) else None
            bound = float(integer.EIGHT_BIT_SPAN ** 2 * (k or _UNKNOWN_CONTRACTION))
        shift = integer.shift_for(bound)
        if steps is None:
            b_int = self.activation(b, self.unit_scale(shift), b_zero, name + "_b")
            if b_int is None:
                return None
            return self.em.op("MatMul", [a_int, b_int], name=name + "_integer"), shift
        grouped = conv and int((attributes or {}).get("group", 1)) != 1
        runs = [(0, len(steps))] if grouped else integer.chunks(steps, integer.EIGHT_BIT_SPAN)
        weight_axis, out_axis = (0, 1) if conv else (b_data.ndim - 1, -1)
        out_rank = b_data.ndim if conv else max(b_data.ndim, 2)
        step_axis = 1 if conv else b_data.ndim - 2

        def weight_part(start: int, end: int) -> ir.Value:
            whole = (start, end) == (0, len(steps))
            data = b_data if whole else np.take(b_data, np.arange(start, end), axis=step_axis)
            return self.weight(_Weight(data, weight_axis, out_rank, out_axis), np.float32(2.0 ** -shift), b_zero,
                               f"{name}_weight", source=b if whole else None)

        bias_value = None
        if bias is not None:
            bias_value = self.em.const((bias.astype(np.float64) * 2.0 ** -shift).astype(np.float32), name + "_bias")
        a_axis = 1 if conv else -1

        def op(op_type, inputs, attrs):
            value = self.em.op(op_type, inputs, attrs, name=f"{name}_{op_type.lower()}")
            value.dtype = ir.DataType.FLOAT
            return value

        total = integer.chunked_product(op, lambda array: self.em.const(array, name + "_slice"),
                                        "Conv" if conv else "MatMul", a_int, weight_part, runs, a_axis,
                                        attributes or {}, bias_value)
        return total, shift

    def shifted(self, scale: ir.Value, shift: int, name: str) -> ir.Value:
        """``scale * 2**shift`` (exact): the scale a shifted integer sum is multiplied by."""
        if not shift:
            return scale
        array = const_array(scale)
        if array is not None:
            return self.em.const((array.astype(np.float32) * np.float32(2.0 ** shift)).astype(np.float32),
                                 name + "_shifted_scale")
        value = self.em.op("Mul", [scale, self.em.const(np.array(2.0 ** shift, np.float32), name + "_shift")],
                           name=name + "_shifted_scale")
        value.dtype = ir.DataType.FLOAT
        return value

    def _finish(self, anchor: ir.Node, product: tuple[ir.Value, int], scale: ir.Value, bias: ir.Value | None,
                name: str) -> None:
        """Replace ``anchor``'s output by the sum times the (shifted) scale [+ bias]."""
        total, shift = product
        out = self.em.op("Mul", [total, self.shifted(scale, shift, name)], name=name + "_scaled")
        out.dtype = ir.DataType.FLOAT
        if bias is not None:
            out = self.em.op("Add", [out, bias], name=name + "_bias")
            out.dtype = ir.DataType.FLOAT
        self.em.flush(anchor)
        replace_output(self.graph, anchor.outputs[0], out)
        self.graph.remove(anchor, safe=True)

    # -- com.microsoft ops -----------------------------------------------------------------------

    def dynamic_quantize_matmul(self, node: ir.Node) -> bool:
        """DynamicQuantizeMatMul(A, B, b_scale, b_zero_point?, bias?): A quantised as DynamicQuantizeLinear does."""
        a, b, b_scale = node.inputs[0], node.inputs[1], node.inputs[2]
        if b_scale is None or b_scale.dtype not in (ir.DataType.FLOAT, None):
            return False
        name = node.name or "DynamicQuantizeMatMul"
        q, a_scale, a_zero = self.dynamic_quantized(a, name + "_a")
        return self._integer_matmul(node, q, a_scale, a_zero, b, b_scale, _input(node, 3), _input(node, 4), name)

    def matmul_integer_to_float(self, node: ir.Node) -> bool:
        """MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias?)."""
        a, b, a_scale, b_scale = node.inputs[:4]
        if any(s is None or s.dtype not in (ir.DataType.FLOAT, None) for s in (a_scale, b_scale)):
            return False  # an fp16 scale needs ai.onnx 19's DequantizeLinear; leave it to the backend
        if not _per_tensor(a_scale):
            return False
        name = node.name or "MatMulIntegerToFloat"
        return self._integer_matmul(node, a, a_scale, _input(node, 4), b, b_scale, _input(node, 5), _input(node, 6),
                                    name)

    def _integer_matmul(self, node, a, a_scale, a_zero, b, b_scale, b_zero, bias, name) -> bool:
        """onnxruntime's kernel: the int32 product times (a_scale * b_scale), then the bias."""
        product = self.integer_product(a, a_zero, b, b_zero, name)
        if product is None:
            return False
        total, shift = product
        # a_scale * (b_scale * 2**shift) is (a_scale * b_scale) * 2**shift exactly
        scale = self.em.op("Mul", [a_scale, self.shifted(b_scale, shift, name)], name=name + "_scale")
        scale.dtype = ir.DataType.FLOAT
        self._finish(node, (total, 0), scale, bias, name)
        return True

    def dynamic_quantized(self, x: ir.Value, name: str) -> tuple[ir.Value, ir.Value, ir.Value]:
        """DynamicQuantizeLinear(x): (uint8 values, scale, zero point), one per tensor."""
        key = ("quantized", id(x))
        if key not in self._activations:
            self._activations[key] = self.em.op("DynamicQuantizeLinear", [x], outputs=3, name=name + "_quantize")
        return self._activations[key]


# A run-time B whose contraction size is unknown: the fp16 shift assumes this many steps.
_UNKNOWN_CONTRACTION = 4096


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
