"""``edgebuild verify PACKAGE --reference MODEL.jaxexport``: a package held to JAX running the export,
with no recipe, through the frontend's own reference runner (the core names no JAX)."""

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from edgebuild_testplugin.cli_runner import run_in_process
from jax_checks import export, jax, jnp

W = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32) * 0.5


def built(x):
    hidden = jnp.tanh(x @ W)
    return jax.nn.softmax(hidden, axis=-1), hidden


def other(x):  # the same signature; only its first output differs from built's
    hidden = jnp.tanh(x @ W)
    return jax.nn.softmax(jnp.sin(3 * hidden), axis=-1), hidden


def renamed_input(y):
    return built(y)


def with_scale(x, scale):
    return built(x * scale)


def scaled_and_sliced(x, scale, start):  # 0-d inputs, which a Core ML package takes as shape [1]
    return jax.lax.dynamic_slice(x * scale, (start, 0), (1, 16))


def write(folder: Path, name: str, exported, form: str = "jaxexport") -> Path:
    path = folder / f"{name}.{form}"
    if form == "jaxexport":
        path.write_bytes(bytes(exported.serialize()))
    elif form == "mlir":
        path.write_text(exported.mlir_module())
    else:
        path.write_bytes(bytes(exported.mlir_module_serialized))
    return path


def build(folder: Path, source: Path, inputs: str = "") -> Path:
    """The fp32 package of ``source`` (no validate stage: verify is what judges it)."""
    from edgebuild.build.run import run_recipes

    recipe = folder / f"{source.stem}.yaml"
    recipe.write_text(f"edgebuild: 1\nname: {source.stem}\nsource: {{model: {source.name}{inputs}}}\n"
                      f"target: {{backend: coreml, precision: float32}}\noutputs: {{dir: {source.stem}.build}}\n")
    with contextlib.redirect_stdout(io.StringIO()):
        code = run_recipes([str(recipe)], cache_dir=str(folder / "cache"), as_json=True,
                           console=Console(file=io.StringIO()))
    assert code == 0
    return folder / f"{source.stem}.build" / "default" / "model.mlpackage"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Sources and the packages built from two of them."""
    from jax import export as jax_export

    folder = tmp_path_factory.mktemp("verify")
    x = np.zeros((2, 16), np.float32)
    (batch,) = jax_export.symbolic_shape("b")
    found = {"folder": folder}
    for form in ("jaxexport", "mlir", "mlirbc"):
        found[form] = write(folder, "built", export(built, x), form)
    found["other"] = write(folder, "other", export(other, x))
    found["renamed"] = write(folder, "renamed", export(renamed_input, x))
    found["symbolic"] = write(folder, "symbolic", export(built, jax.ShapeDtypeStruct((batch, 16), np.float32)))
    found["with_scale"] = write(folder, "with_scale", export(with_scale, x, np.zeros((), np.float32)))
    found["scalars"] = write(folder, "scalars", export(scaled_and_sliced, x, np.zeros((), np.float32),
                                                      np.zeros((), np.int32)))
    found["package"] = build(folder, found["jaxexport"])
    found["scalars_package"] = build(folder, found["scalars"])
    found["scaled_package"] = build(folder, found["with_scale"], ", inputs: {scale: {value: 1.5}}")
    return found


@pytest.fixture
def cli(capsys):
    return lambda *args: run_in_process(capsys, "verify", *map(str, args))


@pytest.mark.parametrize("form", ["jaxexport", "mlir", "mlirbc"])
def test_the_package_verifies_against_the_export_it_was_built_from(work, cli, form):
    code, out, err = cli(work["package"], "--reference", work[form], "--cosine-min", "0.9999", "--samples", "3",
                         "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["reference"] == "stablehlo (eager)" and record["failures"] == []
    (metrics,) = (runtime["metrics"] for runtime in record["runtimes"].values())
    assert len(metrics) == 2
    for output in metrics.values():
        assert output["cosine"]["min"] >= 0.9999 and output["max_abs"]["max"] < 1e-4


def test_a_package_of_another_function_fails_naming_the_output(work, cli):
    code, out, err = cli(work["package"], "--reference", work["other"], "--cosine-min", "0.999", "--samples", "3",
                         "--json")
    assert code == 3
    failures = json.loads(out)["failures"]
    failed = {failure["output"] for failure in failures}
    metrics = next(iter(json.loads(out)["runtimes"].values()))["metrics"]
    first, second = metrics  # built's outputs in order: only the first differs
    assert failed == {first}
    assert metrics[second]["cosine"]["min"] >= 0.9999
    assert all(failure["metric"] == "cosine" and failure["value"] < failure["limit"] == 0.999 for failure in failures)
    assert f"threshold output '{first}': cosine" in err


def test_the_json_record_has_the_validation_shape(work, cli):
    code, out, _ = cli(work["package"], "--reference", work["other"], "--cosine-min", "0.999",
                       "--max-abs-max", "10", "--samples", "2", "--json")
    assert code == 3
    record = json.loads(out)
    assert {"samples", "reference", "runtimes", "failures"} <= set(record) and record["samples"] == 2
    ((runtime, measured),) = record["runtimes"].items()
    for output in measured["metrics"].values():
        for metric in ("cosine", "max_abs", "max_rel", "snr_db"):
            assert {"min", "max", "avg"} <= set(output[metric])
    for failure in record["failures"]:
        assert set(failure) >= {"runtime", "output", "metric", "value", "limit", "message"}
        assert failure["runtime"] == runtime


def test_a_symbolic_dim_is_fed_at_the_size_the_package_takes(work, cli):
    code, out, err = cli(work["package"], "--reference", work["symbolic"], "--cosine-min", "0.9999",
                         "--samples", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["failures"] == []


def test_a_scalar_input_is_fed_at_the_rank_the_package_takes(work):
    from edgebuild.cli.verify import verify_artifact
    from edgebuild.recipe.validation import ValidateSection

    section = ValidateSection.model_validate({"samples": 3, "thresholds": {"cosine_min": 0.9999},
                                              "inputs": {"start": {"random": {"low": 0, "high": 2}}}})
    record = verify_artifact(work["scalars_package"], work["scalars"], section)
    assert record["failures"] == [] and record["reference"] == "stablehlo (eager)"


class SizeUnknown:
    """The package's runtime as one that cannot tell an artifact's input shapes (a bundle's)."""

    def __init__(self, runtime):
        self.runtime, self.name = runtime, runtime.name

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def input_shapes(self, artifact):
        return None


def verify_with(work, reference, shapes=None):
    from edgebuild.cli.verify import runtime_for, verify_artifact
    from edgebuild.recipe.validation import ValidateSection
    from edgebuild.registry import get_registry

    registry = get_registry()
    runtime = SizeUnknown(runtime_for(work["package"], registry))
    section = ValidateSection.model_validate({"samples": 2, "thresholds": {"cosine_min": 0.9999}})
    return verify_artifact(work["package"], reference, section, registry=registry, runtime=runtime, shapes=shapes)


def test_an_unpinned_symbolic_dim_is_refused_naming_the_input(work):
    from edgebuild.errors import UsageError

    with pytest.raises(UsageError) as refused:
        verify_with(work, work["symbolic"])
    assert "input 'x' is symbolic (b)" in refused.value.message and "dim 0" in refused.value.message
    assert "--shape x=" in refused.value.hint
    assert verify_with(work, work["symbolic"], {"x": [2, 16]})["failures"] == []


@pytest.mark.parametrize("shape, phrase", [
    ("y=2,16", "--shape y: the reference has no input 'y' (inputs: 'x')"),
    ("x=2", "--shape x: 1 sizes for an input of rank 2"),
    ("x=3,16", "--shape x=3,16: the reference takes x at [2, 16]"),
    ("x=2,a", "expected NAME=D,D,..."),
    ("x", "expected NAME=D,D,..."),
    ("x=0,16", "expected NAME=D,D,..."),
])
def test_a_shape_that_does_not_fit_the_reference_is_a_usage_error(work, cli, shape, phrase):
    code, _, err = cli(work["package"], "--reference", work["jaxexport"], "--shape", shape)
    assert code == 2 and phrase in " ".join(err.split()) and "Traceback" not in err


@pytest.mark.parametrize("reference, package, phrase", [
    ("renamed", "package", "the artifact takes input(s) 'x', which the reference model does not have (it has 'y')"),
    ("with_scale", "package", "it takes input(s) 'scale' that"),
    ("with_scale", "scaled_package", "it takes input(s) 'scale' that"),
])
def test_a_reference_whose_inputs_the_package_does_not_take_is_refused(work, cli, reference, package, phrase):
    code, _, err = cli(work[package], "--reference", work[reference])
    assert code == 2 and phrase in " ".join(err.split()) and "Traceback" not in err
