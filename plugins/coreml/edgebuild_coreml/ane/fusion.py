"""Which ops Core ML folds into the op before them (bias add, batch_norm, activation).

The planner treats a host op and what it absorbs as one unit of work: they always share a compute
unit, and the absorbed ops cost nothing of their own.
"""

from __future__ import annotations

from edgebuild_coreml.ane import mil_view

HOST_OPS = frozenset({"conv", "conv_transpose", "linear", "matmul"})
ACTIVATIONS = frozenset({
    "relu", "relu6", "sigmoid", "sigmoid_hard", "tanh", "scaled_tanh", "gelu", "silu",
    "leaky_relu", "elu", "clamped_relu", "softplus", "prelu", "thresholded_relu",
    "linear_activation", "clip",
})
_CONV_OPS = frozenset({"conv", "conv_transpose"})

# A chain only moves forward through these stages: host -> bias add -> batch_norm -> activation.
_BIAS, _BATCH_NORM, _ACTIVATION = 0, 1, 2


def _stage(host, op) -> int | None:
    if op.op_type == "add" and any(mil_view.is_constant(v) for _, v in mil_view.input_vars(op)):
        return _BIAS
    if op.op_type == "batch_norm" and host.op_type in _CONV_OPS:
        return _BATCH_NORM
    if op.op_type in ACTIVATIONS:
        return _ACTIVATION
    return None


def _sole_consumer(var, block_outputs) -> object | None:
    if var in block_outputs or len(var.child_ops) != 1:
        return None
    return var.child_ops[0]


def fused_groups(ops, block_outputs) -> dict[str, str]:
    """Map each absorbed op's name to its host op's name."""
    absorbed: dict[str, str] = {}
    outputs = set(block_outputs)
    for host in ops:
        if host.op_type not in HOST_OPS or host.name in absorbed:
            continue
        var, last_stage = host.outputs[0], -1
        while (consumer := _sole_consumer(var, outputs)) is not None:
            stage = _stage(host, consumer)
            if stage is None or stage <= last_stage:
                break
            absorbed[consumer.name] = host.name
            var, last_stage = consumer.outputs[0], stage
    return absorbed
