"""Generate ``example_ops.onnx``: a small MLP with ``com.example::RMSNorm`` in the middle.

    x -> MatMul -> Add -> Relu -> Mul -> RMSNorm -> MatMul -> Add -> Sigmoid -> Mul -> y

Core ML runs both ends and the Metal kernel the middle, so a ``bundle`` build has three
segments. Run ``python recipes/models/make_example_ops_model.py`` to regenerate (seeded).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DOMAIN, OP_TYPE = "com.example", "RMSNorm"  # edgebuild-example-ops' op
WIDTH = 32
SHAPE = [1, 8, WIDTH]


def build(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def weight(name, *shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    initializers = [weight("w1", WIDTH, WIDTH), weight("b1", WIDTH), weight("gain", WIDTH, scale=1.0),
                    weight("scale", WIDTH, scale=1.0), weight("w2", WIDTH, WIDTH), weight("b2", WIDTH),
                    weight("gain2", WIDTH, scale=1.0)]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="fc1_bias"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu"),
        helper.make_node("Mul", ["h3", "gain"], ["h4"], name="gain"),
        helper.make_node(OP_TYPE, ["h4", "scale"], ["normed"], domain=DOMAIN, name="rms_norm", epsilon=1e-5),
        helper.make_node("MatMul", ["normed", "w2"], ["h5"], name="fc2"),
        helper.make_node("Add", ["h5", "b2"], ["h6"], name="fc2_bias"),
        helper.make_node("Sigmoid", ["h6"], ["h7"], name="sigmoid"),
        helper.make_node("Mul", ["h7", "gain2"], ["y"], name="gain2"),
    ]
    graph = helper.make_graph(nodes, "example_ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=10, producer_name="make_example_ops_model")


if __name__ == "__main__":
    out = Path(__file__).with_name("example_ops.onnx")
    onnx.save(build(), out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
