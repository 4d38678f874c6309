"""Automatic mixed precision: budgets met on a real package, allocation optimal, recipe errors."""

import itertools
import math

import numpy as np
import pytest
from pydantic import ValidationError

import coremltools as ct
from coremltools.converters.mil import Builder as mb

from edgebuild.errors import RecipeError
from edgebuild_coreml.compress import allocate
from edgebuild_coreml.compress.apply import compress_mlpackage
from edgebuild_coreml.compress.config import validate_compression
from edgebuild_coreml.compress.program import load_program, weight_uses
from edgebuild_coreml.compress.stage import calibration_inputs, compress_stage
from edgebuild_coreml.interpreter import run_mlpackage

WIDTH, BATCH, LAYERS = 128, 4, 5
HEAVY_TAILED = (1, 3)  # palettes fit these badly, so they should get more bits
CANDIDATES = [
    {"mode": "palettize", "nbits": 4},
    {"mode": "palettize", "nbits": 6},
    {"mode": "palettize", "nbits": 8},
    {"mode": "none"},
]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """Five fp16 128x128 linears with tanh between; two have heavy-tailed weights."""
    rng = np.random.default_rng(0)
    weights = [
        (rng.standard_t(2, size=(WIDTH, WIDTH)) * 0.05 if i in HEAVY_TAILED
         else rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        for i in range(LAYERS)
    ]

    @mb.program(input_specs=[mb.TensorSpec(shape=(BATCH, WIDTH))], opset_version=ct.target.iOS17)
    def program(x):
        for i, weight in enumerate(weights):
            x = mb.linear(x=x, weight=weight, name=f"fc{i}")
            if i < LAYERS - 1:
                x = mb.tanh(x=x, name=f"act{i}")
        return x

    model = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                       compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    path = tmp_path_factory.mktemp("mlp") / "mlp.mlpackage"
    model.save(str(path))
    samples = [{"x": rng.standard_normal((BATCH, WIDTH)).astype(np.float32)} for _ in range(4)]
    return path, samples


def _package_bytes(path):
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _cosine_distance(path, reference_path, samples):
    """1 - cosine of the outputs over all samples, computed here independently of the module."""
    ref = np.concatenate([next(iter(run_mlpackage(reference_path, s).values())).ravel() for s in samples])
    got = np.concatenate([next(iter(run_mlpackage(path, s).values())).ravel() for s in samples])
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return 1.0 - float(ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got)))


@pytest.fixture(scope="module")
def uniform(mlp, tmp_path_factory):
    """Measured (bytes, error) of every candidate applied to all layers alike."""
    src, samples = mlp
    out_dir = tmp_path_factory.mktemp("uniform")
    results = {}
    for candidate in CANDIDATES[:3]:
        dst = out_dir / f"{candidate['nbits']}.mlpackage"
        compress_mlpackage(src, dst, validate_compression({"weights": candidate}, target="iOS17"))
        results[candidate["nbits"]] = (_package_bytes(dst), _cosine_distance(dst, src, samples))
    results[16] = (_package_bytes(src), 0.0)
    return results


def _auto(mlp, tmp_path, budget):
    src, samples = mlp
    dst = tmp_path / "auto.mlpackage"
    section = {"auto": {**budget, "candidates": CANDIDATES}}
    report = compress_stage(src, dst, validate_compression(section, target="iOS17"),
                            calibration=lambda count: samples[:count])
    return dst, report


def test_size_budget_is_met_with_less_error_than_uniform_4bit(mlp, uniform, tmp_path):
    src, samples = mlp
    size_4bit, error_4bit = uniform[4]
    size_6bit, _ = uniform[6]
    budget_bytes = (size_4bit + size_6bit) / 2
    dst, report = _auto(mlp, tmp_path, {"max_size_mb": budget_bytes / 1e6})

    measured_size = _package_bytes(dst)
    measured_error = _cosine_distance(dst, src, samples)
    assert measured_size <= budget_bytes
    assert measured_error < error_4bit * 0.7
    auto = report["auto"]
    assert auto["met"] is True
    assert report["applied"] == f"modes chosen per layer for at most {budget_bytes / 1e6:g} MB"  # the report's words
    assert auto["size_mb"] * 1e6 == pytest.approx(measured_size)
    assert auto["error"] == pytest.approx(measured_error, rel=1e-3, abs=1e-9)

    # The artifact holds what the report says: a 2^nbits table per palettised layer.
    program = load_program(ct.models.MLModel(str(dst), skip_model_load=True))
    stored = weight_uses(program)
    chosen = {entry["layer"]: entry["mode"] for entry in auto["chosen"]}
    assert len(chosen) == LAYERS
    bits = {}
    for layer, mode in chosen.items():
        assert stored[layer].mode == ("none" if mode == "none" else "palettize")
        bits[int(layer[2])] = int(mode.split()[1].split("-")[0]) if mode != "none" else 16
    # Mixed, and the heavy-tailed layers get at least as many bits as the well-behaved ones.
    assert len(set(bits.values())) > 1
    assert min(bits[i] for i in HEAVY_TAILED) >= max(bits[i] for i in range(LAYERS) if i not in HEAVY_TAILED)

    labels = {point["label"] for point in auto["points"]}
    assert {"uncompressed", "all palettize 4-bit", "auto (round 1)"} <= labels
    assert all(len(entry["candidates"]) == len(CANDIDATES) for entry in auto["sensitivity"])


def test_error_budget_picks_a_smaller_size_than_any_uniform_allocation_meeting_it(mlp, uniform, tmp_path):
    src, samples = mlp
    budget = math.sqrt(uniform[6][1] * uniform[8][1])  # all-6-bit misses it; all-8-bit meets it
    dst, report = _auto(mlp, tmp_path, {"max_error": budget, "metric": "cosine_distance"})

    measured_error = _cosine_distance(dst, src, samples)
    assert measured_error <= budget
    assert report["auto"]["met"] is True
    smallest_uniform = min(size for size, error in uniform.values() if error <= budget)
    assert _package_bytes(dst) < smallest_uniform


def test_unreachable_size_budget_reports_not_met_and_keeps_the_smallest(mlp, uniform, tmp_path):
    dst, report = _auto(mlp, tmp_path, {"max_size_mb": 0.001})
    assert report["auto"]["met"] is False
    assert _package_bytes(dst) <= uniform[4][0] + 64 * LAYERS
    assert {entry["mode"] for entry in report["auto"]["chosen"]} == {"palettize 4-bit"}


def test_knapsack_matches_exhaustive_search():
    rng = np.random.default_rng(7)
    layers = [[allocate.Option(int(b), float(c)) for b, c in zip(rng.integers(100, 2000, 4), rng.random(4))]
              for _ in range(6)]
    layers[2][1] = allocate.Option(5, math.inf)  # not applicable to that layer
    front = allocate.frontier(layers)

    def total(combo, field):
        return sum(getattr(layers[i][j], field) for i, j in enumerate(combo))

    combos = [c for c in itertools.product(range(4), repeat=6) if math.isfinite(total(c, "cost"))]
    smallest = sum(min(o.bytes for o in options if math.isfinite(o.cost)) for options in layers)
    assert allocate.least_cost_within(front, smallest - 1) is None
    for budget in (smallest, smallest + 700, smallest + 2000, smallest + 5000):
        fitting = [c for c in combos if total(c, "bytes") <= budget]
        picked = allocate.least_cost_within(front, budget)
        assert total(picked, "bytes") <= budget
        assert total(picked, "cost") == pytest.approx(min(total(c, "cost") for c in fitting))
    least = sum(min(o.cost for o in options) for options in layers)
    assert allocate.smallest_within(front, least * 0.99) is None
    for max_cost in (least, least + 0.5, least + 1.5):
        meeting = [c for c in combos if total(c, "cost") <= max_cost]
        picked = allocate.smallest_within(front, max_cost)
        assert total(picked, "cost") <= max_cost
        # Grid rounding may cost at most one unit per layer.
        assert total(picked, "bytes") <= min(total(c, "bytes") for c in meeting) + len(layers) * front.unit


def test_auto_section_rejects_unknown_keys():
    with pytest.raises(ValidationError, match="auto.colour"):
        validate_compression({"auto": {"max_size_mb": 1.0, "colour": "red"}})
    with pytest.raises(ValidationError, match="extra"):
        validate_compression({"auto": {"max_size_mb": 1.0, "candidates": [{"mode": "none", "nbits": 4}]}})


def test_auto_excludes_weights_and_needs_one_budget():
    with pytest.raises(ValidationError, match="auto chooses every layer's weights itself; remove weights"):
        validate_compression({"auto": {"max_size_mb": 1.0}, "weights": {"mode": "linear"}})
    with pytest.raises(ValidationError, match="exactly one budget"):
        validate_compression({"auto": {"max_size_mb": 1.0, "max_error": 0.01}})
    with pytest.raises(ValidationError, match="exactly one budget"):
        validate_compression({"auto": {"metric": "rel_l2"}})
    section = validate_compression({"auto": {"max_error": 0.01}})
    assert [c.mode for c in section.auto.candidates] == ["palettize"] * 3 + ["linear", "none"]
    assert section.auto.samples == 4 and section.auto.metric == "cosine_distance"


def test_auto_candidate_gated_by_deployment_target(mlp, tmp_path):
    src, samples = mlp
    section = {"auto": {"max_size_mb": 1.0, "candidates": [
        {"mode": "palettize", "nbits": 4, "granularity": "per_grouped_channel", "group_size": 16}]}}
    with pytest.raises(RecipeError, match=r"candidates\[0\].*needs iOS18; the recipe targets iOS17"):
        compress_stage(src, tmp_path / "x.mlpackage", validate_compression(section, target="iOS17"),
                       calibration=samples)


def test_stage_params_key_auto_on_calibration_inputs(tmp_path):
    from edgebuild.plugin.validation import ValidateSection
    from edgebuild_coreml.stages import compress_params_of

    validate = {"samples": 4, "inputs": {"x": {"random": {"seed": 1}}}}

    def key(section: dict) -> dict:
        return compress_params_of(validate_compression(section, target="iOS17"), ValidateSection(**validate),
                                  tmp_path, {}, None).key_params()

    plain = key({"weights": {"mode": "linear"}})
    assert plain["calibration"] is None
    auto = key({"auto": {"max_size_mb": 1.0}})
    assert auto["calibration"]["section"]["samples"] == 4
    assert auto["calibration"]["section"]["inputs"] == ValidateSection(**validate).model_dump(mode="json")["inputs"]


def test_calibration_inputs_follow_validate_section_and_mil_names(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from edgebuild.recipe.validation import ValidateSection
    from edgebuild.verify.inputs import generate_inputs

    graph = helper.make_graph(
        [helper.make_node("Relu", ["input.1"], ["y"])], "g",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    section = ValidateSection.model_validate(
        {"samples": 8, "inputs": {"input.1": {"random": {"low": 2.0, "high": 3.0, "seed": 5}}}})

    samples = calibration_inputs(path, {}, section, tmp_path, {"renamed_inputs": {"input.1": "input_1"}}, 3)
    expected = generate_inputs(section.model_copy(update={"samples": 3}), {"input.1": {"shape": [2, 3], "dtype": "float32"}}, tmp_path)
    assert len(samples) == 3
    for got, want in zip(samples, expected):
        assert list(got) == ["input_1"]
        np.testing.assert_array_equal(got["input_1"], want["input.1"])
        assert got["input_1"].min() >= 2.0
