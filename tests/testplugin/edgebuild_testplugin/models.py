"""Small generated ONNX models the tests build on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tiny_model(path: Path, scale: float = 2.0) -> Path:
    """y = relu(x * w + b): enough graph for import and optimise to do real work."""
    w = numpy_helper.from_array(np.full((4,), scale, dtype=np.float32), "w")
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def encoder(path: Path, vocab: int = 1000, positions: int = 64, width: int = 8, int8_table: bool = False) -> Path:
    """A BERT-like embedding block: word + token type + position embeddings, masked by attention_mask."""
    rng = np.random.default_rng(0)
    seq = ["batch", "sequence"]
    inits = [
        numpy_helper.from_array(rng.standard_normal((2, width)).astype(np.float32), "type_table"),
        numpy_helper.from_array(rng.standard_normal((positions, width)).astype(np.float32), "position_table"),
        numpy_helper.from_array(np.arange(positions, dtype=np.int64)[None], "position_ids"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
    ]
    nodes = []
    if int8_table:  # stored int8 with a per-row scale, dequantised in the graph (Cast then Mul)
        inits += [numpy_helper.from_array(rng.integers(-127, 127, (vocab, width)).astype(np.int8), "word_q"),
                  numpy_helper.from_array(np.full((vocab, 1), 0.01, np.float32), "word_scale")]
        nodes += [helper.make_node("Cast", ["word_q"], ["word_f"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["word_f", "word_scale"], ["word_table"])]
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal((vocab, width)).astype(np.float32), "word_table"))
    nodes += [
        helper.make_node("Gather", ["word_table", "input_ids"], ["words"]),
        helper.make_node("Gather", ["type_table", "token_type_ids"], ["types"]),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Slice", ["ids_shape", "one", "axis2"], ["length"]),
        helper.make_node("Slice", ["position_ids", "zero", "length", "one"], ["positions_used"]),
        helper.make_node("Gather", ["position_table", "positions_used"], ["positions"]),
        helper.make_node("Add", ["words", "types"], ["wt"]),
        helper.make_node("Add", ["wt", "positions"], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["embedded", "mask3"], ["hidden"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, seq)
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", width])]
    return save_model(path, nodes, inputs, outputs, inits)


def save_model(path: Path, nodes, inputs, outputs, initializers, opset: int = 17) -> Path:
    """A graph of ``nodes`` saved as ``path``, named after its stem."""
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def point_external_data(path: Path, location: str, save_to: Path | None = None) -> Path:
    """Rewrite every external tensor of the model at ``path`` to read from ``location`` (a path
    onnx's own save refuses: ``../x.bin``, a linked folder); saved at ``save_to``, else in place."""
    proto = onnx.load(str(path), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    target = save_to or path
    onnx.save_model(proto, str(target))
    return target


def no_passes() -> dict[str, bool]:
    """The optimise stage's ``passes`` with every registered pass off: weights stay as imported."""
    from edgebuild.registry import get_registry

    return {name: False for name in get_registry().tables["passes"]}
