"""coremltools' nonreplaceable-var walk is skipped only where it would change nothing: packages come
out byte for byte the same, and a program with ``constexpr_`` ops gets the sets coremltools computes."""

from __future__ import annotations

import contextlib
from pathlib import Path

import coremltools as ct
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.block import Block
from onnx_cases import IR_VERSION, lower

from edgebuild_coreml.lowering import package
from edgebuild_coreml.lowering.nonreplaceable import propagated_only_when_needed

F = onnx.TensorProto.FLOAT


def _conv_net() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [oh.make_node("Conv", ["x", "k", "b"], ["c"], pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["c"], ["r"]),
             oh.make_node("GlobalAveragePool", ["r"], ["p"]),
             oh.make_node("Flatten", ["p"], ["f"]),
             oh.make_node("Gemm", ["f", "w", "wb"], ["y"], transB=1)]
    inits = [onh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "k"),
             onh.from_array(rng.standard_normal(8).astype(np.float32), "b"),
             onh.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w"),
             onh.from_array(rng.standard_normal(4).astype(np.float32), "wb")]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                          [oh.make_tensor_value_info("y", F, [1, 4])], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)


def _package_bytes(path: Path) -> dict[str, bytes]:
    # Manifest.json names its items by fresh UUIDs: the spec and the weights are the package
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file() and f.name != "Manifest.json"}


@pytest.mark.parametrize("precision", ["float16", "float32"])
def test_packages_are_byte_for_byte_those_of_every_walk(tmp_path, monkeypatch, precision):
    walks = []
    walk = Block._propagate_nonreplaceable_vars

    def counted(block):
        walks.append(block.name)
        walk(block)

    monkeypatch.setattr(Block, "_propagate_nonreplaceable_vars", counted)
    skipping = tmp_path / "skipping.mlpackage"
    package.save_mlpackage(lower(_conv_net(), target="iOS17"), skipping, target="iOS17", precision=precision,
                           metadata={}, consume=True)
    skipped = len(walks)
    monkeypatch.setattr(package, "propagated_only_when_needed", contextlib.nullcontext)
    every = tmp_path / "every.mlpackage"
    package.save_mlpackage(lower(_conv_net(), target="iOS17"), every, target="iOS17", precision=precision,
                           metadata={}, consume=True)
    assert len(walks) - skipped > 10 * max(skipped, 1)  # one walk per pass before, (nearly) none now
    assert _package_bytes(skipping) == _package_bytes(every)


def _linear_program():
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 4))], opset_version=ct.target.iOS16)
    def prog(x):
        return mb.linear(x=x, weight=np.ones((3, 4), np.float32), name="linear")

    return prog


def test_a_constexpr_op_made_by_a_pass_turns_the_walk_back_on():
    prog = _linear_program()
    function = prog.functions["main"]
    [linear] = [op for op in function.operations if op.name == "linear"]
    with propagated_only_when_needed(prog):
        with function:  # a pass leaving the block: nothing nonreplaceable yet
            pass
        assert not linear.outputs[0].nonreplaceable_vars_upstream
        with function:  # a pass replacing the weight by a compressed one
            weight = mb.constexpr_affine_dequantize(quantized_data=np.ones((3, 4), np.int8), zero_point=np.int8(0),
                                                    scale=np.float32(0.5), axis=0, before_op=linear)
            linear.set_inputs(weight=weight)
            linear.outputs[0]._nonreplaceable_vars_upstream = set()  # left to the walk on exit
        assert linear.outputs[0].nonreplaceable_vars_upstream == {weight}
    assert "_propagate_nonreplaceable_vars" not in vars(function)


def test_stale_sets_are_walked_as_coremltools_walks_them():
    """A var holding a set when the scope opens (a program read back with compressed weights
    that a pass then removed): the walk runs, and empties it."""
    prog = _linear_program()
    function = prog.functions["main"]
    [linear] = [op for op in function.operations if op.name == "linear"]
    linear.outputs[0]._nonreplaceable_vars_upstream = {linear.weight}
    with propagated_only_when_needed(prog):
        with function:
            pass
    assert not linear.outputs[0].nonreplaceable_vars_upstream
