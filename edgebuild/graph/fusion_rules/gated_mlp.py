"""The SiLU-gated MLP (SwiGLU) of Llama-family decoders -> ``edgebuild::SwiGLU(gate, up)``.

``down(silu(gate(x)) * up(x))``: after ``fuse_bias`` and ``fuse_activations`` the gate and up
projections are ``edgebuild::Linear`` of the same input and the activation is
``edgebuild::Silu``; Phi-3 projects both at once and splits the result in two halves (gate
first). The fused op is ``silu(gate) * up``; the projections stay Linear ops so weight
compression sees them as it sees any other.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import EDGEBUILD_DOMAIN, const_array


def _target(op, gate, up):
    return op.Mul(op.Silu(gate, _domain=EDGEBUILD_DOMAIN), up)


def _is_linear(node) -> bool:
    return node is not None and node.op_type == "Linear" and node.domain == EDGEBUILD_DOMAIN


def _split_halves(gate, up) -> bool:
    """gate and up are the two halves, in that order, of one projection split on its last axis."""
    node = gate.producer()
    if node is None or node.op_type != "Split" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 2:
        return False
    if up.producer() is not node or node.outputs[0] is not gate or node.outputs[1] is not up:
        return False
    source = node.inputs[0]
    axis = node.attributes.get("axis")
    axis = 0 if axis is None else axis.as_int()
    equal_halves = len(node.inputs) < 2 or node.inputs[1] is None or (
        const_array(node.inputs[1]) is not None and len(set(const_array(node.inputs[1]).tolist())) == 1)
    return (_is_linear(source.producer()) and source.shape is not None and axis in (-1, len(source.shape) - 1)
            and equal_halves)


def _replacement(op, gate, up):
    gate_node, up_node = gate.producer(), up.producer()
    if gate.shape is None or gate.shape != up.shape:
        return None
    separate = _is_linear(gate_node) and _is_linear(up_node) and gate_node.inputs[0] is up_node.inputs[0]
    if not (separate or _split_halves(gate, up)):
        return None  # two projections of one input, elementwise product
    return op.SwiGLU(gate, up, _domain=EDGEBUILD_DOMAIN)


def rules() -> list[pattern.RewriteRule]:
    return [pattern.RewriteRule(_target, _replacement, name="swiglu")]
