"""A plugin author's scenario, end to end: a separate op plugin (tests/third_party/swish, distribution
``edgebuild-swish``) lowers ``mydomain::Swish2`` to Core ML, registers its reference and a fusion
pass, and is installed by pip into a fresh venv beside edgebuild.

- its op validates (onnxruntime cannot run it: the reference is onnx's evaluator with the plugin's);
- editing its lowering in place rebuilds lower and everything after it, and the wrong lowering fails
  validation (no stale "validation passed");
- a new version installed from a wheel rebuilds them too;
- an unrelated plugin (``edgebuild-greeter``, one command) installed or removed changes no key;
- the lock file's lower stage names the plugin and the libraries that made the package.

The venv sees this interpreter's packages through a ``.pth`` file (no network), and pip installs
the plugins into the venv alone.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

THIRD_PARTY = Path(__file__).parent / "third_party"

RECIPE = """\
edgebuild: 1
name: swish
source: {model: swish.onnx, inputs: {x: {shape: [1, 64]}}}
target: {backend: coreml, precision: float32}
optimize: {passes: {fuse_activations: false}}  # leave Mul(a, Sigmoid(a)) to the plugin's pass
validate:
  samples: 4
  runtimes: [interpreter]
  inputs: {x: {random: {low: -4.0, high: 4.0}}}
  thresholds: {cosine_min: 0.9999}
outputs: {dir: out}
"""

AFTER_LOWERING = ("lower", "package", "validate")
LOWERING_LINE = '    beta = float(ctx.attr(node, "beta", 1.0))\n'
WRONG_LOWERING_LINE = '    beta = 0.5 * float(ctx.attr(node, "beta", 1.0))  # a bug: half the beta\n'


def _model(path: Path) -> None:
    """y = Swish2(a) spelt Mul(a, Sigmoid(a)) for the pass, where a = Swish2(x, beta=1.7)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Swish2", ["x"], ["a"], domain="mydomain", beta=1.7),
             helper.make_node("Sigmoid", ["a"], ["gate"]),
             helper.make_node("Mul", ["a", "gate"], ["y"])]
    graph = helper.make_graph(nodes, "swish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("mydomain", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=9), path)


class Venv:
    """A venv whose site-packages also holds this interpreter's (a .pth file), with pip run from it."""

    def __init__(self, root: Path, work: Path):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        self.python = root / "bin" / "python"
        site_packages = Path(self._run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
        parents = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
        # addsitedir, not a bare path: it reads the parent's .pth files too (its editable installs)
        (site_packages / "parent_site_packages.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in parents))
        self.work = work
        self.env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
                    "EDGEBUILD_CACHE_DIR": str(work / "cache")}

    def _run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([str(self.python), *args], capture_output=True, text=True, cwd=getattr(self, "work", None),
                              env=getattr(self, "env", None))
        if check and done.returncode != 0:
            raise AssertionError(f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def pip(self, *args: str) -> None:
        self._run("-m", "pip", "--disable-pip-version-check", "--no-input", *args)

    def edgebuild_run(self) -> tuple[int, dict, str]:
        done = subprocess.run([str(self.python), "-m", "edgebuild", "run", "recipe.yaml", "--json"], cwd=self.work,
                              capture_output=True, text=True, env=self.env)
        try:
            [variant] = json.loads(done.stdout)["variants"]
        except (ValueError, KeyError) as exc:
            raise AssertionError(f"edgebuild run exited {done.returncode} without its JSON:\n{done.stdout}\n"
                                 f"{done.stderr}") from exc
        return done.returncode, variant, done.stderr


def _statuses(variant: dict) -> dict[str, str]:
    return {stage["name"]: stage["status"] for stage in variant["stages"]}


def _keys(variant: dict) -> dict[str, str]:
    return {stage["name"]: stage["key"] for stage in variant["stages"]}


def _cosine_min(variant: dict) -> float:
    return variant["validation"]["runtimes"]["interpreter"]["metrics"]["y"]["cosine"]["min"]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    work = tmp_path_factory.mktemp("third_party")
    for package in ("swish", "greeter"):  # copies: the test edits them
        shutil.copytree(THIRD_PARTY / package, work / package, ignore=shutil.ignore_patterns("*.egg-info", "build"))
    _model(work / "swish.onnx")
    (work / "recipe.yaml").write_text(RECIPE)
    environment = Venv(work / "venv", work)
    environment.pip("install", "--no-deps", "--no-build-isolation", "-e", str(work / "swish"))
    return environment


def test_a_third_party_op_plugin_is_rebuilt_when_it_changes_and_validates_its_op(venv):
    work = venv.work

    # 1. the plugin's op builds, its pass runs, and the artifact is validated against the op's reference
    code, first, err = venv.edgebuild_run()
    assert code == 0 and first["status"] == "built", err
    assert first["validation"]["failures"] == [] and _cosine_min(first) > 0.9999
    assert "mydomain::Swish2 (edgebuild-swish 0.1.0)" in first["validation"]["reference"]
    report = json.loads((work / "out" / "default" / "report.json").read_text())
    assert report["optimize"]["rules"]["fuse_swish2"] == 1
    assert report["optimize"]["op_counts_after"] == {"mydomain::Swish2": 2}

    # 2. an edit of the lowering in place (editable install) rebuilds lower and what follows, and fails
    lowering = work / "swish" / "edgebuild_swish" / "coreml.py"
    source = lowering.read_text()
    assert source.count(LOWERING_LINE) == 1
    lowering.write_text(source.replace(LOWERING_LINE, WRONG_LOWERING_LINE))
    code, edited, err = venv.edgebuild_run()
    statuses = _statuses(edited)
    assert all(statuses[stage] == "ran" for stage in AFTER_LOWERING), statuses
    assert code == 3 and edited["status"] == "failed", (code, edited["status"], err)
    assert _cosine_min(edited) < 0.9999 and edited["validation"]["failures"]

    # 3. the fixed lowering released as 0.2.0 and installed from a wheel: rebuilt again, and it passes
    lowering.write_text(source)
    project = work / "swish" / "pyproject.toml"
    project.write_text(project.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    venv.pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "wheels"), str(work / "swish"))
    [wheel] = (work / "wheels").glob("edgebuild_swish-0.2.0-*.whl")
    venv.pip("install", "--no-deps", str(wheel))
    code, released, err = venv.edgebuild_run()
    statuses = _statuses(released)
    assert code == 0 and released["status"] == "built", err
    assert all(statuses[stage] == "ran" for stage in AFTER_LOWERING), statuses
    assert {_keys(released)[s] for s in AFTER_LOWERING}.isdisjoint(_keys(first)[s] for s in AFTER_LOWERING)
    assert "(edgebuild-swish 0.2.0)" in released["validation"]["reference"]

    # 4. an unrelated plugin (a command only), installed then removed, changes no key: all cached
    venv.pip("install", "--no-deps", "--no-build-isolation", str(work / "greeter"))
    assert "hello, plugin author" in venv._run("-m", "edgebuild", "greet", "--name", "plugin author")
    for change in ("installed", "removed"):
        code, again, err = venv.edgebuild_run()
        assert code == 0 and _keys(again) == _keys(released), (change, err)
        assert set(_statuses(again).values()) == {"cached"}, (change, _statuses(again))
        if change == "installed":
            venv.pip("uninstall", "--yes", "edgebuild-greeter")

    # 5. the lock file's lower stage names the plugin and the library versions that made the package
    lock = json.loads((work / "out" / "default" / "edgebuild.lock.json").read_text())
    lower = lock["stages"]["lower"]
    assert lower["plugins"]["edgebuild-swish"] == "0.2.0"
    assert "edgebuild-greeter" not in lower["plugins"]
    assert lower["libraries"]["coremltools"] == md.version("coremltools")


def test_the_third_party_plugins_import_only_the_public_plugin_api():
    import ast

    imported = set()
    for path in THIRD_PARTY.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    from_edgebuild = {name for name in imported if name.split(".")[0] == "edgebuild"}
    assert from_edgebuild and all(name == "edgebuild.plugin" or name.startswith("edgebuild.plugin.")
                                  for name in from_edgebuild), from_edgebuild
