"""The SiLU-gated MLP (SwiGLU) of Llama-family decoders -> ``edgebuild::SwiGLU(gate, up)``.

``down(silu(gate(x)) * up(x))``: after ``fuse_bias`` and ``fuse_activations`` the gate and up
projections are ``edgebuild::Linear`` of the same input and the activation is
``edgebuild::Silu``. The fused op is ``silu(gate) * up``; the projections stay Linear ops so
weight compression sees them as it sees any other.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import EDGEBUILD_DOMAIN


def _target(op, gate, up):
    return op.Mul(op.Silu(gate, _domain=EDGEBUILD_DOMAIN), up)


def _replacement(op, gate, up):
    gate_node, up_node = gate.producer(), up.producer()
    for node in (gate_node, up_node):
        if node is None or node.op_type != "Linear" or node.domain != EDGEBUILD_DOMAIN:
            return None
    if gate_node.inputs[0] is not up_node.inputs[0] or gate.shape != up.shape:
        return None  # two projections of one input, elementwise product
    return op.SwiGLU(gate, up, _domain=EDGEBUILD_DOMAIN)


def rules() -> list[pattern.RewriteRule]:
    return [pattern.RewriteRule(_target, _replacement, name="swiglu")]
