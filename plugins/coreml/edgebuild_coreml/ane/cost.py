"""A roofline cost model per MIL op: FLOPs and bytes, time per compute unit, cost of a switch.

time(op, unit) = max(flops / sustained peak, bytes / sustained bandwidth) + dispatch overhead.
The constants below are estimates (Core ML publishes none of them); they rank placements, they
do not predict wall-clock latency to better than a small factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgebuild_coreml.ane import mil_view
from edgebuild_coreml.ane.chips import ChipProfile
from edgebuild_coreml.ane.rules import compressed_weight_units

UNITS = ("ane", "gpu", "cpu")

# Fraction of the peak FLOP rate and of memory bandwidth a unit sustains on real layers (estimate).
SUSTAINED_COMPUTE = {"ane": 0.5, "gpu": 0.6, "cpu": 0.6}
SUSTAINED_BANDWIDTH = {"ane": 0.7, "gpu": 0.8, "cpu": 0.6}

# Fixed cost per op per unit, in ms (estimate): the ANE runs a compiled segment with little
# per-layer overhead, the GPU pays a kernel encode/dispatch, the CPU a function call.
DISPATCH_MS = {"ane": 0.004, "gpu": 0.012, "cpu": 0.002}

# Fixed latency of handing a tensor from one unit to another, in ms (estimate). ANE <-> CPU is
# cheaper than ANE <-> GPU, as hollance/neural-engine observed from Core ML's own choices.
SWITCH_LATENCY_MS = {
    frozenset({"ane", "cpu"}): 0.05,
    frozenset({"gpu", "cpu"}): 0.08,
    frozenset({"ane", "gpu"}): 0.15,
}

# FLOPs per output element for elementwise work; transcendental functions cost more.
_TRANSCENDENTAL = {
    "exp", "exp2", "log", "sigmoid", "tanh", "gelu", "silu", "erf", "softplus", "elu", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "atanh", "pow", "rsqrt", "sqrt",
    "inverse", "softsign", "scaled_tanh", "softplus_parametric",
}
_NORM_FLOPS_PER_ELEMENT = {
    "batch_norm": 2, "layer_norm": 5, "instance_norm": 5, "l2_norm": 3, "local_response_norm": 6,
}
_POOLS = {"max_pool", "avg_pool", "l2_pool"}
_RESIZES = {
    "upsample_nearest_neighbor": 1, "resize_nearest_neighbor": 1, "upsample_bilinear": 4,
    "resize_bilinear": 4, "resize": 4, "crop_resize": 4, "resample": 4,
}
_REDUCTIONS_PREFIX = "reduce_"


@dataclass(frozen=True)
class OpCost:
    flops: float
    bytes: float
    # unit -> bytes not read there because it reads compressed weights (see rules.yaml)
    saved: tuple[tuple[str, float], ...] = ()

    def bytes_on(self, unit: str) -> float:
        return self.bytes - dict(self.saved).get(unit, 0.0)


def _numel(var) -> int:
    return mil_view.static_numel(var)


def _io_bytes(op) -> int:
    """Bytes read and written: every tensor input (weights included) and output."""
    read = sum(mil_view.nbytes(v) for _, v in mil_view.input_vars(op) if mil_view.is_tensor_like(v))
    written = sum(mil_view.nbytes(v) for v in mil_view.tensor_outputs(op))
    return read + written


def _stored_bytes(var) -> float:
    """Bytes a constant takes as stored: int4 and other sub-byte types count their bits."""
    name = mil_view.dtype_name(var)
    bits = int("".join(ch for ch in name if ch.isdigit()) or 8)
    return mil_view.static_numel(var) * bits / 8.0


def _compressed_savings(op) -> tuple[tuple[str, float], ...]:
    """Per unit, the dense bytes minus the stored bytes of the compressed weights ``op`` reads there."""
    table = compressed_weight_units()
    saved: dict[str, float] = {}
    for _, var in mil_view.input_vars(op):
        producer = var.op
        if producer is None or producer.op_type not in table or not mil_view.is_tensor_like(var):
            continue
        stored = sum(_stored_bytes(v) for _, v in mil_view.input_vars(producer) if mil_view.is_tensor_like(v))
        for unit in table[producer.op_type]:
            saved[unit] = saved.get(unit, 0.0) + max(0.0, mil_view.nbytes(var) - stored)
    return tuple(sorted(saved.items()))


def _conv_flops(op) -> float:
    weight = op.inputs["weight"]
    per_output = math.prod(int(d) for d in mil_view.shape_of(weight)[1:])
    if op.op_type == "conv_transpose":
        return 2.0 * _numel(op.inputs["x"]) * per_output
    return 2.0 * _numel(op.outputs[0]) * per_output


def _linear_flops(op) -> float:
    in_features = int(mil_view.shape_of(op.inputs["weight"])[-1])
    return 2.0 * _numel(op.outputs[0]) * in_features


def _matmul_flops(op) -> float:
    x_shape = mil_view.shape_of(op.inputs["x"])
    transpose_x = bool(mil_view.param(op, "transpose_x", False))
    inner = x_shape[-2] if transpose_x and len(x_shape) > 1 else x_shape[-1]
    inner = 1 if mil_view.is_symbolic_dim(inner) else int(inner)
    return 2.0 * _numel(op.outputs[0]) * inner


def _attention_flops(op) -> float:
    q, k, v = (mil_view.shape_of(op.inputs[n]) for n in ("query", "key", "value"))
    batch_heads = _numel(op.inputs["query"]) / max(1, int(q[-2]) * int(q[-1]))
    length, source, depth, value_depth = int(q[-2]), int(k[-2]), int(q[-1]), int(v[-1])
    scores = batch_heads * length * source
    # QK^T, softmax (~5 FLOP/element), then the product with V.
    return 2.0 * scores * depth + 5.0 * scores + 2.0 * scores * value_depth


def _elementwise_flops(op) -> float:
    per_element = 4.0 if op.op_type in _TRANSCENDENTAL else 1.0
    return per_element * sum(_numel(v) for v in mil_view.tensor_outputs(op))


def op_flops(op) -> float:
    """Floating-point operations of one op (0 for pure data movement)."""
    kind = op.op_type
    if kind in ("conv", "conv_transpose"):
        return _conv_flops(op)
    if kind == "linear":
        return _linear_flops(op)
    if kind == "matmul":
        return _matmul_flops(op)
    if kind == "scaled_dot_product_attention":
        return _attention_flops(op)
    if kind == "softmax":
        return 5.0 * _numel(op.outputs[0])
    if kind in _NORM_FLOPS_PER_ELEMENT:
        return _NORM_FLOPS_PER_ELEMENT[kind] * _numel(op.outputs[0])
    if kind in _POOLS:
        kernel = mil_view.param(op, "kernel_sizes", [1]) or [1]
        return float(_numel(op.outputs[0]) * math.prod(int(k) for k in kernel))
    if kind in _RESIZES:
        return float(_RESIZES[kind] * _numel(op.outputs[0]))
    if kind.startswith(_REDUCTIONS_PREFIX):
        return float(_numel(op.inputs["x"]))
    if _is_elementwise(op):
        return _elementwise_flops(op)
    return 0.0  # data movement (reshape, transpose, concat, gather ...): bytes only


def _is_elementwise(op) -> bool:
    outputs = mil_view.tensor_outputs(op)
    inputs = mil_view.data_inputs(op)
    if len(outputs) != 1 or not inputs:
        return False
    # Same element count in and out, and the op is not a known data-movement op.
    movement = {"reshape", "transpose", "expand_dims", "squeeze", "identity", "cast", "reverse",
                "slice_by_index", "slice_by_size", "concat", "split", "tile", "pad", "flatten2d",
                "depth_to_space", "space_to_depth", "pixel_shuffle", "pixel_unshuffle"}
    return op.op_type not in movement and _numel(outputs[0]) >= max(_numel(v) for v in inputs)


def op_cost(op) -> OpCost:
    """FLOPs and bytes moved for one op (symbolic dimensions count as 1)."""
    try:
        flops = op_flops(op)
    except (KeyError, IndexError, TypeError, ValueError):
        flops = 0.0  # unusual signature: fall back to bytes only
    return OpCost(flops=flops, bytes=float(_io_bytes(op)), saved=_compressed_savings(op))


def peak_flops(chip: ChipProfile, unit: str, *, dtype: str = "fp16", int8: bool = False) -> float:
    """Peak FLOP/s of ``unit`` on ``chip`` for the op's compute type."""
    if unit == "ane":
        tops = chip.ane_tops.value if (int8 and chip.ane_int8_compute) else chip.ane_fp16_tflops
        return tops * 1e12
    if unit == "gpu":
        figure = chip.gpu_fp32_tflops if dtype == "fp32" else chip.gpu_fp16_tflops
        return figure.value * 1e12
    return chip.cpu_gflops.value * 1e9


def unit_time_ms(
    cost: OpCost, unit: str, chip: ChipProfile, *, dtype: str = "fp16", int8: bool = False
) -> float:
    """Roofline time of one op on ``unit``, in milliseconds, dispatch overhead included."""
    compute_s = cost.flops / (peak_flops(chip, unit, dtype=dtype, int8=int8) * SUSTAINED_COMPUTE[unit])
    memory_s = cost.bytes_on(unit) / (chip.bandwidth_gbs.value * 1e9 * SUSTAINED_BANDWIDTH[unit])
    return max(compute_s, memory_s) * 1e3 + DISPATCH_MS[unit]


def switch_cost_ms(nbytes: float, source: str, target: str, chip: ChipProfile) -> float:
    """Cost of moving a tensor of ``nbytes`` from one unit to another (0 if the unit is the same)."""
    if source == target:
        return 0.0
    latency = SWITCH_LATENCY_MS[frozenset({source, target})]
    return latency + nbytes / (chip.bandwidth_gbs.value * 1e9) * 1e3
