"""The shipped recipes of real ONNX models build and match onnxruntime on their source.

Each test runs ``edgebuild run --json`` on a small recipe that ``extends:`` the shipped one,
with fewer validation samples (the shipped recipes use 32) and outputs in a temp folder, and
holds the validation record to the targets of the issue:

- fp32: cosine >= 0.99999 and max relative error (floor 1e-3) <= 1e-4 on every output, except
  where the recipe documents a looser per-output limit;
- fp16 (the interpreter on the fp16 artifact): cosine >= 0.999, and top-1 agreement >= 99% for
  classifiers.

Two small classifiers run by default; all six models under ``-m slow``. Sources are fetched
with pip once per session into a shared cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = 4
FP32_COSINE, FP32_MAX_REL = 0.99999, 1e-4
FP16_COSINE, FP16_TOP1 = 0.999, 0.99
CLASSIFIERS = {"orientation", "ppocr_cls"}

# (recipe, variant) pairs; the default run keeps the two cheapest.
DEFAULT = [("ppocr_cls", "fp16"), ("orientation", "fp32")]
SLOW = [
    ("ppocr_cls", "fp32"), ("orientation", "fp16"),
    ("ddddocr_det", "fp32"), ("ddddocr_det", "fp16"),
    ("minilm_paraphrase", "fp32"), ("minilm_paraphrase", "fp16"),
    ("minilm_int8", "fp32"), ("minilm_int8", "fp16"),
    ("silero_vad", "fp32"), ("silero_vad", "fp16"),
]


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One store for the whole session: each model is downloaded once, shared stages built once."""
    return tmp_path_factory.mktemp("real-models-cache")


def build(recipe: str, variant: str, cache: Path, workdir: Path) -> tuple[dict, Path]:
    """``edgebuild run --json`` on the shipped recipe with SAMPLES samples; (variant record, output dir)."""
    shipped = ROOT / "recipes" / f"{recipe}.yaml"
    small = workdir / f"{recipe}.yaml"
    small.write_text(
        f"extends: {json.dumps(str(shipped))}\n"
        f"validate: {{samples: {SAMPLES}}}\n"
        "outputs: {dir: out}\n"
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, "-m", "edgebuild.cli.app", "run", str(small), "--variant", variant,
         "--cache-dir", str(cache), "--json"],
        capture_output=True, text=True, cwd=workdir, env=env, timeout=1800,
    )
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{recipe}:{variant} failed: {record.get('error')}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    return record, Path(record["output_dir"])


def interpreter_metrics(validation: dict) -> tuple[dict, dict]:
    runtime = validation["runtimes"]["interpreter"]
    return runtime["metrics"], runtime["limits"]


def is_float_output(metrics: dict) -> bool:
    # integer pass-through outputs (token ids, masks) compare exactly; they have no cosine limit to hold
    return "cosine" in metrics


def check_targets(recipe: str, variant: str, validation: dict) -> None:
    assert validation["samples"] == SAMPLES
    assert validation["failures"] == []
    metrics, limits = interpreter_metrics(validation)
    assert metrics, "no outputs were compared"
    for output, values in metrics.items():
        assert values["nonfinite"]["max"] == 0, f"{output}: NaN/inf where onnxruntime is finite"
        if not is_float_output(values):
            continue
        limit = limits[output]
        if variant == "fp32":
            assert limit["cosine_min"] >= FP32_COSINE
            assert values["cosine"]["min"] >= FP32_COSINE, f"{output}: cosine {values['cosine']['min']}"
            # the issue's target, unless the recipe documents a looser limit for this output
            assert values["max_rel"]["max"] <= max(FP32_MAX_REL, limit["max_rel_max"]), output
            assert limit["max_rel_max"] <= 5e-3  # documented fp32-resolution exceptions only
        else:
            assert limit["cosine_min"] >= FP16_COSINE
            assert values["cosine"]["min"] >= FP16_COSINE, f"{output}: cosine {values['cosine']['min']}"
            if recipe in CLASSIFIERS:
                assert values["top1_agreement"]["min"] >= FP16_TOP1, output


def run_and_check(recipe: str, variant: str, cache: Path, workdir: Path) -> None:
    record, out_dir = build(recipe, variant, cache, workdir)
    check_targets(recipe, variant, record["validation"])
    artifact = Path(record["artifacts"][0])
    assert artifact.name == "model.mlpackage" and (artifact / "Manifest.json").is_file()
    # report.json carries the same validation record as --json
    report = json.loads((out_dir / "report.json").read_text())
    check_targets(recipe, variant, report["validation"])


@pytest.mark.parametrize(("recipe", "variant"), DEFAULT, ids=[f"{r}-{v}" for r, v in DEFAULT])
def test_real_model_matches_onnxruntime(recipe, variant, model_cache, tmp_path):
    run_and_check(recipe, variant, model_cache, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "variant"), SLOW, ids=[f"{r}-{v}" for r, v in SLOW])
def test_real_model_matches_onnxruntime_slow(recipe, variant, model_cache, tmp_path):
    run_and_check(recipe, variant, model_cache, tmp_path)


@pytest.mark.parametrize("recipe", sorted(CLASSIFIERS | {"ddddocr_det", "minilm_paraphrase", "minilm_int8", "silero_vad"}))
def test_shipped_recipe_holds_the_issue_targets(recipe):
    """The shipped recipes themselves ask for 32 samples and the issue's thresholds."""
    from edgebuild.recipe import load_recipe

    variants = {v.name: v.recipe for v in load_recipe(ROOT / "recipes" / f"{recipe}.yaml")}
    assert set(variants) == {"fp32", "fp16"}
    fp32, fp16 = variants["fp32"].validate_, variants["fp16"].validate_
    assert fp32.samples == fp16.samples == 32
    assert variants["fp32"].target.precision == "float32" and variants["fp16"].target.precision == "float16"
    assert fp32.thresholds.cosine_min == FP32_COSINE and fp32.thresholds.max_rel_max == FP32_MAX_REL
    assert fp16.thresholds.cosine_min == FP16_COSINE
    if recipe in CLASSIFIERS:
        assert fp16.thresholds.top1_agreement_min == FP16_TOP1
    assert variants["fp32"].source.sha256 and variants["fp32"].source.model.startswith("pypi:")
    first_line = (ROOT / "recipes" / f"{recipe}.yaml").read_text().splitlines()[0]
    assert first_line == "# yaml-language-server: $schema=../schemas/recipe.schema.json"


def test_gather_nd_of_a_bool_mask_matches_onnxruntime():
    """MiniLM-int8 gathers its attention mask (bool) with GatherND; MIL's gather_nd takes no bools."""
    import numpy as np
    import onnx
    import onnx.helper as oh
    import onnx_ir as ir
    import onnxruntime as ort

    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.lowering.converter import convert

    graph = oh.make_graph(
        [oh.make_node("Cast", ["mask"], ["flags"], to=onnx.TensorProto.BOOL),
         oh.make_node("GatherND", ["flags", "index"], ["picked"], batch_dims=1),
         oh.make_node("Not", ["picked"], ["y"])],
        "g",
        [oh.make_tensor_value_info("mask", onnx.TensorProto.INT64, [2, 6]),
         oh.make_tensor_value_info("index", onnx.TensorProto.INT64, [2, 3, 1])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.BOOL, [2, 3])],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=10)
    mask = np.array([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 0]], np.int64)
    index = np.array([[[0], [2], [-1]], [[5], [1], [-6]]], np.int64)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"mask": mask, "index": index})

    result = convert(ir.serde.deserialize_model(proto), target="iOS17")
    names = result.input_names
    produced = run_program(result.program, {names["mask"]: mask.astype(np.int32), names["index"]: index.astype(np.int32)})
    np.testing.assert_array_equal(np.asarray(produced[result.output_names["y"]]).astype(bool), expected)


def test_slice_to_int64_max_matches_onnxruntime():
    """ddddocr and silero slice "to the end" with INT64_MAX, a constant int32 cannot hold."""
    import numpy as np
    import onnx.helper as oh
    import onnx.numpy_helper as onh
    import onnx_ir as ir
    import onnxruntime as ort
    from onnx import TensorProto

    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.lowering.converter import convert

    big = np.iinfo(np.int64).max
    bounds = [onh.from_array(np.array(v, np.int64), n) for n, v in
              (("starts", [1, 2]), ("ends", [big, big]), ("axes", [2, 3]), ("steps", [2, 1]))]
    graph = oh.make_graph(
        [oh.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])], "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)], bounds,
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=10)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    [expected] = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})

    result = convert(ir.serde.deserialize_model(proto), target="iOS17")
    produced = run_program(result.program, {result.input_names["x"]: x})
    np.testing.assert_array_equal(np.asarray(produced[result.output_names["y"]]), expected)
