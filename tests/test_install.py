"""Installable like a library: ranges not pins, extras that name the plugin distributions,
constraint files in step with the ranges, the test plugin kept out of user installs, and
``edgebuild --version``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from edgebuild_testplugin.cli_runner import edgebuild
from edgebuild._version import __version__

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the newest-set CI job runs these
ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIRS = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))


def project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def runtime_requirements() -> list[tuple[str, Requirement]]:
    found = [("edgebuild", Requirement(r)) for r in project(ROOT / "pyproject.toml")["dependencies"]]
    for folder in PLUGIN_DIRS:
        meta = project(folder / "pyproject.toml")
        found += [(meta["name"], Requirement(r)) for r in meta["dependencies"]]
    return found


def constraints(name: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            pins[req.name.lower().replace("_", "-")] = Version(next(iter(req.specifier)).version)
    return pins


def test_runtime_dependencies_are_ranges_not_pins_or_direct_references():
    for owner, req in runtime_requirements():
        assert req.url is None, f"{owner}: {req} is a direct reference"
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{owner}: {req} is pinned"


def test_extras_name_the_first_party_plugin_distributions():
    core = project(ROOT / "pyproject.toml")
    plugins = {project(p / "pyproject.toml")["name"]: Version(project(p / "pyproject.toml")["version"]) for p in PLUGIN_DIRS}
    extras = core["optional-dependencies"]
    expected = {"coreml": "edgebuild-coreml", "pytorch": "edgebuild-pytorch", "jax": "edgebuild-jax",
                "bundle": "edgebuild-mpsgraph"}
    for extra, dist in expected.items():
        [req] = [Requirement(r) for r in extras[extra]]
        assert req.name == dist and req.url is None
        assert req.specifier.contains(plugins[dist]), f"[{extra}] does not admit the tree's {dist} {plugins[dist]}"
    assert Requirement(extras["all"][0]).extras == {"coreml", "pytorch", "jax", "bundle", "remote", "dask"}
    # every plugin accepts the core version of this tree
    core_version = Version(__version__)
    for owner, req in runtime_requirements():
        if req.name == "edgebuild":
            assert req.specifier.contains(core_version), owner


def test_the_test_plugin_is_installed_only_into_the_test_environment():
    everything = " ".join(" ".join(v) for v in project(ROOT / "pyproject.toml")["optional-dependencies"].values())
    assert "testplugin" not in everything
    makefile = (ROOT / "Makefile").read_text()
    user_targets = [line for line in makefile.splitlines() if line.startswith("\t$(BIN)/")]
    assert user_targets and not any("testplugin" in line for line in user_targets)
    assert any("tests/testplugin" in line for line in makefile.splitlines() if line.startswith("\t$(TEST_BIN)/"))


def test_lowest_constraints_pin_every_lower_bound():
    lowest = constraints("lowest.txt")
    for owner, req in runtime_requirements():
        name = req.name.lower()
        if name.startswith("edgebuild"):
            continue
        floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert floors, f"{owner}: {req} has no lower bound"
        assert lowest.get(name) == max(floors), f"constraints/lowest.txt: {name} should be {max(floors)} ({owner})"


def test_newest_constraints_lie_inside_every_range():
    newest = constraints("newest.txt")
    for owner, req in runtime_requirements():
        name = req.name.lower()
        if name in newest:
            assert req.specifier.contains(newest[name], prereleases=True), f"{name} {newest[name]} outside {req} ({owner})"
    assert {"coremltools", "onnx", "pydantic", "numpy", "torch"} <= set(newest)


def test_version_lists_edgebuild_and_every_plugin():
    done = edgebuild("--version", check=0)
    lines = done.stdout.splitlines()
    assert re.match(r"edgebuild \d+\.\d+\.\d+", lines[0])
    from importlib.metadata import entry_points

    dists = {ep.dist.name for ep in entry_points(group="edgebuild") if ep.dist and ep.dist.name != "edgebuild"}
    assert dists and all(any(line.strip().startswith(d + " ") for line in lines[1:]) for d in dists)


@pytest.mark.slow
def test_a_user_install_from_the_tree_has_the_backend_and_not_the_test_plugin(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints" / "newest.txt")]
    subprocess.run([*pip, f"{ROOT}[coreml]", str(ROOT / "plugins" / "coreml")], check=True, cwd=tmp_path)
    done = subprocess.run([str(venv / "bin" / "edgebuild"), "--version"], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": ""})
    assert "edgebuild-coreml" in done.stdout and "testplugin" not in done.stdout


DISTRIBUTIONS = [ROOT, *PLUGIN_DIRS]


@pytest.mark.parametrize("folder", DISTRIBUTIONS, ids=lambda p: p.name)
def test_every_distribution_carries_what_an_index_page_shows(folder):
    meta = project(folder / "pyproject.toml")
    assert (folder / meta["readme"]).is_file() and meta["description"]
    assert meta["license"] == "Apache-2.0" and all((folder / f).is_file() for f in meta["license-files"])
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in meta["classifiers"])
    assert not any(c.startswith("License ::") for c in meta["classifiers"])  # the SPDX expression says it
    if folder != ROOT:
        assert meta["version"] == __version__, f"{meta['name']} is released with the core"


def test_the_release_workflow_builds_every_distribution_and_publishes_with_a_trusted_publisher():
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    build, publish = workflow["jobs"]["build"], workflow["jobs"]["publish"]
    assert any(step.get("run") == "make wheels" for step in build["steps"])
    assert publish["needs"] == "build" and publish["permissions"] == {"id-token": "write"}
    assert [s["uses"].split("@")[0] for s in publish["steps"]] == ["actions/download-artifact",
                                                                   "pypa/gh-action-pypi-publish"]
    assert workflow["permissions"] == {"contents": "read"}  # nothing else may write
    # make wheels builds every one of them (a dry run prints the loop with its folders expanded)
    dry = subprocess.run(["make", "-n", "wheels"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    loop = next(line for line in dry.splitlines() if "-m build" in line)
    assert set(loop.split(";")[0].split(" in ")[1].split()) == {".", *(f"plugins/{p.name}" for p in PLUGIN_DIRS)}
