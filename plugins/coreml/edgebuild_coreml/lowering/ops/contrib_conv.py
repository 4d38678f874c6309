"""FusedConv: activation(Conv(X, W, B) + Z), onnxruntime's Conv + activation fusion.

The convolution is conv.py's (same attributes); Z, the optional sum input, is added before
the activation, as onnxruntime's kernel does. ``activation_params`` carry the activation's
attributes in the order its ONNX op lists them.
"""

from __future__ import annotations

from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, fconst
from edgebuild_coreml.lowering.ops.conv import conv
from edgebuild_coreml.lowering.registry import lowers

DOMAIN = "com.microsoft"


def _params(ctx, node, activation: str, count: int) -> list[float]:
    params = [float(p) for p in ctx.attr(node, "activation_params", [])]
    if len(params) < count:
        ctx.fail(node, f"activation {activation} needs {count} activation_params; the node has {len(params)}")
    return params


def _activate(ctx, node, activation: str, y):
    name = ctx.name(node)
    if activation == "Relu":
        return mb.relu(x=y, name=name)
    if activation == "Tanh":
        return mb.tanh(x=y, name=name)
    if activation == "Sigmoid":
        return mb.sigmoid(x=y, name=name)
    if activation == "LeakyRelu":
        return mb.leaky_relu(x=y, alpha=_params(ctx, node, activation, 1)[0], name=name)
    if activation == "Clip":
        low, high = _params(ctx, node, activation, 2)[:2]
        return mb.clip(x=y, alpha=fconst(y, low), beta=fconst(y, high), name=name)
    if activation == "HardSigmoid":
        alpha, beta = _params(ctx, node, activation, 2)[:2]
        return mb.sigmoid_hard(x=y, alpha=alpha, beta=beta, name=name)
    if activation == "HardSwish":  # x * HardSigmoid(x; 1/6, 1/2)
        gate = mb.sigmoid_hard(x=y, alpha=1.0 / 6.0, beta=0.5, name=ctx.name(node, "gate"))
        return mb.mul(x=y, y=gate, name=name)
    ctx.fail(node, f"activation {activation!r} is not one onnxruntime fuses into Conv",
             "use Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid or HardSwish")


@lowers("FusedConv", domain=DOMAIN)
def fused_conv(ctx, node):
    activation = ctx.attr(node, "activation", "")
    activation = activation.decode() if isinstance(activation, bytes) else activation
    y = conv(ctx, node)
    z = as_float(ctx.input(node, 3, optional=True))
    if z is not None:
        y = mb.add(x=y, y=z, name=ctx.name(node, "sum"))
    if not activation:
        return y
    return _activate(ctx, node, activation, y)
