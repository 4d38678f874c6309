"""Malformed recipes: each names the file, line, column and dotted field, and exits 2."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper
from pydantic import ConfigDict

from edgebuild.build.jobs import load_variants
from edgebuild.errors import RecipeError, UsageError
from edgebuild.hookspecs import hookimpl
from edgebuild.protocols import Frontend, RecipeSection
from edgebuild.recipe import load_recipe
from edgebuild.recipe.formats import source_format
from edgebuild.recipe.model import Source
from edgebuild.registry import build_registry, get_registry

GOOD = """\
edgebuild: 1
name: demo
source:
  model: m.onnx
  inputs: {x: {shape: [1, 3, 8, 8], dtype: float32}}
target: {backend: testcopy}
"""

CASES = [
    # (recipe text, expected "file:line:col path: message" fragment)
    (GOOD.replace("edgebuild: 1", "edgebuild: 2"), "recipe.yaml:1:12 edgebuild: must be one of 1"),
    (GOOD.replace("name: demo", "name: 'has space'"), "recipe.yaml:2:7 name: string should match pattern"),
    (GOOD.replace("  model: m.onnx\n", ""), "recipe.yaml:4:3 source.model: required key is missing"),
    (GOOD.replace("target: {backend: testcopy}", "target: {backend: testcopy, deploymnt_target: iOS17}"),
     "recipe.yaml:6:29 target.deploymnt_target: unknown key 'deploymnt_target'; did you mean 'deployment_target'?"),
    (GOOD.replace("target: {backend: testcopy}", "target: {backend: testcopy, precision: float8}"),
     "recipe.yaml:6:40 target.precision: must be one of float16, float32"),
    (GOOD.replace("target: {backend: testcopy}", "target: {backend: testcopy, deployment_target: iOS12}"),
     "recipe.yaml:6:48 target.deployment_target: must be one of iOS15"),
    (GOOD + "compute: {policy: cpu_and_nee}\n", "recipe.yaml:7:19 compute.policy: must be one of auto, all, cpu_only"),
    (GOOD + "compute:\n  overrides:\n    - {match: {name: 'conv[('}, unit: cpu}\n",
     "recipe.yaml:9:22 compute.overrides.0.match.name: not a valid regular expression"),
    (GOOD + "compute:\n  overrides:\n    - {match: {op_type: conv}, unit: tpu}\n",
     "recipe.yaml:9:38 compute.overrides.0.unit: must be one of ane, gpu, cpu"),
    (GOOD.replace("dtype: float32", "dtype: complex64"), "recipe.yaml:5:44 source.inputs.x.dtype: must be one of float32, float16, int64"),
    (GOOD.replace("source:", "sorce:", 1), "recipe.yaml:3:1 sorce: unknown key 'sorce'; did you mean 'source'?"),
    (GOOD + "source2: {}\n", "recipe.yaml:7:1 source2: unknown key 'source2'; did you mean 'source'?"),
    (GOOD + "validate:\n  samples: 0\n", "recipe.yaml:8:12 validate.samples: input should be greater than or equal to 1"),
    (GOOD + "validate:\n  thresholds: {cosine_mni: 0.9}\n",
     "recipe.yaml:8:16 validate.thresholds.cosine_mni: unknown key 'cosine_mni'; did you mean 'cosine_min'?"),
    (GOOD + "variants:\n  fp16: {target: {precision: half}}\n",
     "recipe.yaml:8:30 target.precision: must be one of float16, float32"),
    (GOOD + "variants:\n  - fp16\n", "recipe.yaml:8:3 variants: must map variant names to overrides"),
    (GOOD + "compression: {level: high}\n", "recipe.yaml:7:22 compression.level: input should be a valid integer"),
    (GOOD + "compression: {levle: 2}\n", "recipe.yaml:7:15 compression.levle: unknown key 'levle'; did you mean 'level'?"),
    (GOOD + "name: again\n", "recipe.yaml:7:1 name: duplicate key (first at line 2)"),
    (GOOD + "source: [unclosed\n", "recipe.yaml:8:1 invalid YAML"),
    (GOOD.replace("shape: [1, 3, 8, 8]", "shape: [1, 3, {enumerated: []}, 8]"),
     "recipe.yaml:5:43 source.inputs.x.shape.2.enumerated: list should have at least 1 item"),
    (GOOD + "optimize: {passes: {fuse_conv_bn: maybe}}\n", "recipe.yaml:7:35 optimize.passes.fuse_conv_bn: input should be a valid boolean"),
]


@pytest.mark.parametrize("text, expected", CASES, ids=[c[1].split(" ")[1].rstrip(":") + f"-{i}" for i, c in enumerate(CASES)])
def test_malformed_recipe_reports_location(tmp_path, monkeypatch, text, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text(text)
    with pytest.raises(RecipeError) as info:
        load_variants(["recipe.yaml"], None, get_registry())
    assert expected in str(info.value), str(info.value)
    assert info.value.exit_code == 2


def test_extends_cycle_is_detected(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text(GOOD + "extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(RecipeError, match=r"extends cycle: .*a.yaml -> .*b.yaml -> .*a.yaml"):
        load_recipe("a.yaml")


def test_extends_and_variants_deep_merge(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text(GOOD + "compute: {policy: cpu_only, chip: m1}\n")
    (tmp_path / "child.yaml").write_text(
        "extends: base.yaml\nname: child\ncompute: {chip: m4}\n"
        "compression: {level: 3}\n"
        "variants:\n  plain: {compression: null}\n  strong: {compression: {level: 9}, target: {precision: float32}}\n"
    )
    variants = {v.name: v.recipe for v in load_recipe("child.yaml")}
    assert variants["plain"].compute.policy == "cpu_only" and variants["plain"].compute.chip == "m4"
    assert variants["plain"].compression is None
    assert variants["strong"].compression == {"level": 9}
    assert variants["strong"].target.precision == "float32" and variants["strong"].target.backend == "testcopy"


def test_unknown_variant_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(GOOD + "variants: {a: {}, b: {}}\n")
    with pytest.raises(RecipeError, match="no variant 'c'; the recipe has a, b"):
        load_recipe("r.yaml", only=["c"])


def test_yaml_tags_cannot_construct_objects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(GOOD + "metadata: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(RecipeError, match="invalid YAML"):
        load_recipe("r.yaml")


def write_model(path) -> None:
    """An identity model with GOOD's input x: [1, 3, 8, 8] float32."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "m", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_variant_switching_mode_replaces_the_section_instead_of_merging(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text(
        GOOD
        + "compression:\n  weights: {mode: palettize, nbits: 4, granularity: per_grouped_channel, group_size: 16}\n"
        + "variants:\n  int8: {compression: {weights: {mode: linear, dtype: int8}}}\n"
        + "  six: {compression: {weights: {nbits: 6}}}\n")
    variants = {v.name: v.recipe for v in load_variants(["r.yaml"], None, get_registry())}
    assert variants["int8"].compression == {"weights": {"mode": "linear", "dtype": "int8"}}
    assert variants["six"].compression["weights"] == {
        "mode": "palettize", "nbits": 6, "granularity": "per_grouped_channel", "group_size": 16}


class _TfliteOptions(RecipeSection):
    model_config = ConfigDict(extra="forbid")
    delegate: str = "xnnpack"
    threads: int = 1


class _TfliteFrontend(Frontend):
    def import_model(self, path, inputs, out_dir, *, options=None, base_dir=None):
        raise NotImplementedError  # the recipe only loads here


class _TflitePlugin:
    """A third party's frontend for a format edgebuild does not know, with its own source.options."""

    @hookimpl
    def edgebuild_register_frontends(self, register):
        register("tflite", _TfliteFrontend())

    @hookimpl
    def edgebuild_register_recipe_sections(self, register):
        register("tflite:source.options", _TfliteOptions)


def test_a_registered_frontend_is_a_valid_source_format_and_its_options_load_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.tflite").write_bytes(b"not read at load")
    (tmp_path / "r.yaml").write_text(GOOD.replace("  model: m.onnx\n", "  model: m.tflite\n  format: tflite\n"
                                                  "  options: {threads: 4}\n"))
    registry = build_registry({"tflite-plugin": _TflitePlugin()})
    (variant,) = load_variants(["r.yaml"], None, registry)
    assert source_format(variant.recipe.source) == "tflite"
    assert variant.section("tflite:source.options") == _TfliteOptions(threads=4)
    assert variant.params["source"]["options"] == {"delegate": "xnnpack", "threads": 4}  # defaults applied


@pytest.mark.parametrize("fmt, phrase", [("onxx", "did you mean 'onnx'?"), ("tflite", "no installed plugin reads 'tflite'")])
def test_an_unregistered_format_names_the_installed_ones(tmp_path, monkeypatch, fmt, phrase):
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text(GOOD.replace("  model: m.onnx\n", f"  model: m.onnx\n  format: {fmt}\n"))
    with pytest.raises(RecipeError) as info:
        load_variants(["r.yaml"], None, get_registry())
    assert str(info.value).startswith("r.yaml:5:11 source.format: ") and phrase in str(info.value), str(info.value)
    assert "onnx" in info.value.hint and "installed formats" in info.value.hint


@pytest.mark.parametrize("model, fmt", [("m.onnx", "onnx"), ("M.ONNX", "onnx"), ("w.pt", "pytorch"), ("w.pt2", "pytorch"),
                                        ("w.jit", "pytorch"), ("w.pth", "pytorch"), ("w.safetensors", "pytorch"),
                                        ("pypi:pkg==1.0#pkg/m.onnx", "onnx"), ("https://example.invalid/w.pt", "pytorch")])
def test_source_format_from_the_suffix(model, fmt):
    assert source_format(Source(model=model)) == fmt
    assert source_format(Source(model=model, format="custom")) == "custom"


def test_no_suffix_and_no_format_cannot_be_told():
    with pytest.raises(UsageError, match="cannot tell the format of 'm.bin'"):
        source_format(Source(model="m.bin"))


def test_sections_stay_on_the_variant_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text(GOOD + "compression: {level: 3}\nvariants:\n  plain: {compression: null}\n  three: {}\n")
    variants = {v.name: v for v in load_variants(["r.yaml"], None, get_registry())}
    assert variants["plain"].section("testcopy:compression") is None
    assert variants["three"].section("testcopy:compression").level == 3
    assert variants["three"].params["compression"] == {"level": 3, "weights": None}  # defaults applied


def test_an_unvalidated_section_is_never_read_as_absent(tmp_path, monkeypatch):
    """A variant loaded without the registry has not had its sections validated: reading one is an error."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(GOOD + "compression: {level: 3}\n")
    (variant,) = load_recipe("r.yaml")
    with pytest.raises(RuntimeError, match="compression was not validated"):
        variant.section("testcopy:compression")
    assert variant.section("testcopy:target.options") is None  # nothing written there
