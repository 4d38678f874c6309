"""Weight-only dequantisation spelled out -> ``DequantizeLinear(w, scale, zero_point)``.

Some exporters store int8 weights and expand them with ``Cast -> [Sub zp] -> Mul scale``.
Left alone, constant folding would turn that back into a float weight four times the size;
as a DequantizeLinear (which folding leaves alone) the backend can keep it compressed.
Scales and zero points may be per tensor or per channel along one axis.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import const_array, new_initializer

QUANTIZED = (ir.DataType.INT8, ir.DataType.UINT8)


def _cast_mul(op, w, scale):
    return op.Mul(op.Cast(w, _outputs=["cast_out"]), scale)


def _cast_sub_mul(op, w, zp, scale):
    return op.Mul(op.Sub(op.Cast(w, _outputs=["cast_out"]), zp), scale)


def _per_axis(array: np.ndarray, weight_shape: tuple[int, ...]) -> tuple[np.ndarray, int | None] | None:
    """(1-D values, axis) for a per-channel array, (scalar, None) for a per-tensor one."""
    if array.size == 1:
        return array.reshape(()), None
    if array.ndim > len(weight_shape):
        return None
    padded = (1,) * (len(weight_shape) - array.ndim) + tuple(array.shape)
    varying = [i for i, d in enumerate(padded) if d != 1]
    if len(varying) != 1 or padded[varying[0]] != weight_shape[varying[0]]:
        return None
    return array.reshape(-1), varying[0]


def _dequantize(op, w, scale, cast_out, zp=None):
    weight = const_array(w)
    scales = const_array(scale)
    if weight is None or scales is None or w.dtype not in QUANTIZED:
        return None
    target = cast_out.producer().attributes.get("to")
    if target is None or target.as_int() != ir.DataType.FLOAT or scales.dtype != np.float32:
        return None  # DequantizeLinear yields float32 at opset 13
    scale_axis = _per_axis(scales, weight.shape)
    zero = np.zeros((), weight.dtype)
    zp_axis = (zero, None)
    if zp is not None:
        zp_array = _zero_point_array(zp)
        if zp_array is None or np.any(zp_array != np.round(zp_array)):
            return None
        info = np.iinfo(weight.dtype)
        if zp_array.min() < info.min or zp_array.max() > info.max:
            return None
        zp_axis = _per_axis(zp_array.astype(weight.dtype), weight.shape)
    if scale_axis is None or zp_axis is None:
        return None
    (s, s_ax), (z, z_ax) = scale_axis, zp_axis
    if s_ax is not None and z_ax is not None and s_ax != z_ax:
        return None
    axis = s_ax if s_ax is not None else z_ax
    if axis is not None:  # DequantizeLinear wants scale and zero point of the same shape
        channels = weight.shape[axis]
        s = np.broadcast_to(s, (channels,)).copy()
        z = np.broadcast_to(z, (channels,)).copy()
    scale_init = new_initializer(op, s.astype(np.float32), cast_out, "dq_scale")
    zp_init = new_initializer(op, z.astype(weight.dtype), cast_out, "dq_zero_point")
    attrs = {} if axis is None else {"axis": axis}
    return op.DequantizeLinear(w, scale_init, zp_init, **attrs)


def _zero_point_array(zp) -> np.ndarray | None:
    """The zero point's values, whether stored as float or as a Cast of an integer constant."""
    direct = const_array(zp)
    if direct is not None:
        return direct.astype(np.float64)
    producer = zp.producer()
    if producer is not None and producer.op_type == "Cast":
        inner = const_array(producer.inputs[0])
        return None if inner is None else inner.astype(np.float64)
    return None


def rules() -> list[pattern.RewriteRule]:
    return [
        pattern.RewriteRule(_cast_sub_mul, _dequantize, name="dequantize_sub_mul"),
        pattern.RewriteRule(_cast_mul, _dequantize, name="dequantize_mul"),
    ]
