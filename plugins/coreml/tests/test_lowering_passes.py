"""The curated MIL pass list builds the same packages as coremltools' default pipeline.

Packages are built both ways (``passes="default"``, coremltools' full pipeline validated after
every pass, and ``passes="lowering"``) and compared: the ops in order (constants as a sorted
list of dtypes and shapes, since passes may create them in another order) and the outputs of
the saved programs in the MIL interpreter. Small graphs exercising each kept pass run by
default; the dev models' recipes too (two cheap ones by default, all six at both precisions
under ``-m slow``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.block import InvalidBlockStateError
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
from onnx_cases import IR_VERSION, lower

from edgebuild_coreml.interpreter import load_mlpackage, run_program
from edgebuild_coreml.lowering import passes as lowering_passes
from edgebuild_coreml.lowering.package import save_mlpackage

ROOT = Path(__file__).resolve().parents[3]
F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


# -- comparing two saved programs -------------------------------------------------------------
def _ops(block):
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from _ops(inner)


def op_list(program) -> tuple[list, list]:
    """(non-const ops as (type, output dtypes) in order, sorted (dtype, shape) of the constants)."""
    ops, consts = [], []
    for op in _ops(program.functions["main"]):
        dtypes = tuple(getattr(v.dtype, "__name__", str(v.dtype)) for v in op.outputs)
        if op.op_type == "const":
            consts.append((dtypes, tuple(op.outputs[0].shape)))
        else:
            ops.append((op.op_type, dtypes))
    return ops, sorted(consts)


def sample_feed(program, seed: int = 0) -> dict[str, np.ndarray]:
    """Values in [0, 1) for float inputs, ones for integer ones (token ids and masks stay valid)."""
    rng = np.random.default_rng(seed)
    feed = {}
    for name, var in program.functions["main"].inputs.items():
        shape = [int(d) for d in var.shape]
        dtype = getattr(var.dtype, "__name__", "")
        if dtype.startswith(("int", "uint", "bool")):
            feed[name] = np.ones(shape, np.int32)
        else:
            feed[name] = rng.random(shape).astype(np.float16 if dtype == "fp16" else np.float32)
    return feed


def assert_same_packages(old: Path, new: Path) -> None:
    before, after = load_mlpackage(old), load_mlpackage(new)
    assert op_list(after) == op_list(before)
    feed = sample_feed(before)
    expected, actual = run_program(before, feed), run_program(after, feed)
    assert expected.keys() == actual.keys()
    for name in expected:
        want, got = np.asarray(expected[name], np.float64), np.asarray(actual[name], np.float64)
        # the same ops on the same constants: equal up to summation order, NaN where NaN
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True, err_msg=name)


# -- the pass lists -----------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_pass_lists_name_registered_passes(precision):
    for which in lowering_passes.PIPELINES:
        names = lowering_passes.pass_pipeline(precision, passes=which).passes
        assert all(name in PASS_REGISTRY for name in names)
        assert (lowering_passes.GUARDED_FP16_CAST_PASS in names) == (precision == "float16")
        assert lowering_passes.FP16_CAST_PASS not in names
    default = lowering_passes.pass_pipeline(precision, passes="default").passes
    assert len(lowering_passes.lowering_passes(precision)) < len(default) / 2


def test_unknown_pass_list_is_refused():
    with pytest.raises(ValueError, match="unknown pass list"):
        lowering_passes.pass_pipeline("float32", passes="everything")


def test_validated_once_skips_checks_inside_and_runs_one_at_the_end():
    @mb.program(input_specs=[mb.TensorSpec(shape=(2,))])
    def prog(x):
        return mb.relu(x=mb.add(x=x, y=np.float32(1.0), name="plus"), name="out")

    [plus] = [op for op in prog.functions["main"].operations if op.name == "plus"]
    with pytest.raises(InvalidBlockStateError):
        with lowering_passes.validated_once(prog):
            plus.outputs[0]._child_ops.clear()  # a pass that forgot to link its reader
            prog.validate()  # what coremltools calls after each pass: skipped here
    assert "validate" not in vars(prog)  # the method is the class's again


# -- small graphs, each exercising kept passes ---------------------------------------------------
def _model(nodes, inputs, outputs, initializers=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=IR_VERSION)


def _transformer_bits():
    """Transpose into MatMul, an Identity, a weight stored twice, a gather with a negative index."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    nodes = [
        oh.make_node("Transpose", ["w1"], ["wt"], perm=[1, 0]),
        oh.make_node("MatMul", ["x", "wt"], ["h"]),
        oh.make_node("Identity", ["h"], ["hi"]),
        oh.make_node("MatMul", ["hi", "w2"], ["h2"]),
        oh.make_node("Gather", ["h2", "idx"], ["g"], axis=1),
        oh.make_node("Softmax", ["g"], ["y"], axis=-1),
    ]
    inits = [onh.from_array(w, "w1"), onh.from_array(w.copy(), "w2"),
             onh.from_array(np.array([-1, 0, 3], np.int64), "idx")]
    return _model(nodes, [oh.make_tensor_value_info("x", F, [2, 8])], [oh.make_tensor_value_info("y", F, [2, 3])],
                  inits)


def _conv_net():
    rng = np.random.default_rng(1)
    nodes = [
        oh.make_node("Conv", ["x", "k", "b"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c"], ["r"]),
        oh.make_node("Div", ["r", "two"], ["d"]),
        oh.make_node("Reshape", ["d", "shape"], ["y"]),
    ]
    inits = [onh.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "k"),
             onh.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             onh.from_array(np.array(2.0, np.float32), "two"),
             onh.from_array(np.array([1, -1], np.int64), "shape")]
    return _model(nodes, [oh.make_tensor_value_info("x", F, [1, 3, 6, 6])],
                  [oh.make_tensor_value_info("y", F, [1, 144])], inits)


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("make", [_transformer_bits, _conv_net], ids=["transformer_bits", "conv_net"])
def test_small_graphs_build_the_same_package_both_ways(tmp_path, make, precision):
    paths = {}
    for which in lowering_passes.PIPELINES:
        paths[which] = tmp_path / which / "model.mlpackage"
        save_mlpackage(lower(make(), target="iOS17"), paths[which], target="iOS17", precision=precision,
                       metadata={}, consume=True, passes=which)
    assert_same_packages(paths["default"], paths["lowering"])


# -- the dev models --------------------------------------------------------------------------------
DEV_DEFAULT = [("ppocr_cls", "fp16"), ("orientation", "fp32")]
DEV_SLOW = [(recipe, variant)
            for recipe in ("orientation", "ppocr_cls", "ddddocr_det", "minilm_paraphrase", "minilm_int8", "silero_vad")
            for variant in ("fp32", "fp16") if (recipe, variant) not in DEV_DEFAULT]


@pytest.fixture(scope="module")
def dev_store(tmp_path_factory):
    from edgebuild.store.location import open_store

    return open_store(str(tmp_path_factory.mktemp("dev-models-cache")))


def _lower_both_ways(recipe: str, variant: str, store, out: Path) -> dict[str, Path]:
    from edgebuild.build.jobs import load_variants, plan_jobs
    from edgebuild.dag.executor import Executor
    from edgebuild.registry import get_registry

    from edgebuild_coreml.lower import lower_model
    from edgebuild_coreml.stages import lower_params_of

    registry = get_registry()
    [build] = plan_jobs(load_variants([str(ROOT / "recipes" / f"{recipe}.yaml")], [variant], registry),
                        registry, store)
    build.job.stages = [s for s in build.job.stages if s.name in ("resolve", "import", "optimize")]
    Executor(store).run([build.job])
    assert build.job.error is None, build.job.error
    variant_ = build.variant
    paths, infos = {}, {}
    for which in lowering_passes.PIPELINES:
        paths[which] = out / which / "model.mlpackage"
        infos[which] = lower_model(build.job.results["optimize"].path / "model.onnx", paths[which],
                                   lower_params_of(variant_), registry, base_dir=variant_.base_dir, passes=which)
    # the fp16 guard saw the same program both ways
    assert infos["lowering"].get("fp16_guard") == infos["default"].get("fp16_guard")
    return paths


def _check_dev_model(recipe, variant, store):
    with tempfile.TemporaryDirectory() as tmp:
        paths = _lower_both_ways(recipe, variant, store, Path(tmp))
        assert_same_packages(paths["default"], paths["lowering"])


@pytest.mark.parametrize(("recipe", "variant"), DEV_DEFAULT)
def test_cheap_dev_models_build_the_same_package_both_ways(recipe, variant, dev_store):
    _check_dev_model(recipe, variant, dev_store)


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "variant"), DEV_SLOW)
def test_dev_models_build_the_same_package_both_ways(recipe, variant, dev_store):
    _check_dev_model(recipe, variant, dev_store)
