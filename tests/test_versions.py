"""Key versions: a release is named by its version, a working copy also by its sources."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from edgebuild import versions
from test_uptodate import run


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``kvpkg`` importable from a fresh directory, and no remembered digests."""
    root = tmp_path / "src" / "kvpkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("X = 1\n")
    (root / "sub" / "rules.yaml").write_text("a: 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setattr(versions, "_watched", {})
    versions.source_digest.cache_clear()
    versions.is_working_copy.cache_clear()
    yield root
    versions.source_digest.cache_clear()
    versions.is_working_copy.cache_clear()
    sys.modules.pop("kvpkg", None)


def _digest() -> str:
    versions.source_digest.cache_clear()
    return versions.source_digest("kvpkg")


def test_source_digest_follows_contents_and_names_not_bytecode(package):
    first = _digest()
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert _digest() == first
    (package / "sub" / "rules.yaml").write_text("a: 2\n")  # data files count too
    second = _digest()
    assert second != first
    (package / "sub" / "rules.yaml").rename(package / "sub" / "other.yaml")
    assert _digest() != second
    watched = versions.watched_paths()
    assert str(package / "__init__.py") in watched and str(package / "sub") in watched
    assert not any("__pycache__" in path for path in watched)


def test_only_working_copies_carry_a_source_digest(package):
    assert versions.key_version("2.0.0", "numpy") == "2.0.0"  # installed in site-packages: a release
    assert versions.edgebuild_version().startswith("0.1.0+src.")  # `make install` installs it editable
    assert versions.key_version("1.0", "kvpkg") == f"1.0+src.{_digest()}"
    assert versions.key_version("1.0", "no_such_package_here") == "1.0"


PLUGIN = '''
from edgebuild.hookspecs import hookimpl
from edgebuild.protocols import GraphPass


class Noop(GraphPass):
    description = "rewrites nothing"

    def apply(self, model):
        return 0


@hookimpl
def edgebuild_register_passes(register):
    register("kv_noop", Noop())
'''


def test_editing_a_plugin_working_copy_rebuilds_what_it_produced(project, tmp_path):
    site = tmp_path / "site"
    (site / "kvplugin").mkdir(parents=True)
    source = site / "kvplugin" / "__init__.py"
    source.write_text(PLUGIN)
    info = site / "kvplugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvplugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[edgebuild]\nkvplugin = kvplugin\n")
    env = {"PYTHONPATH": str(site)}
    recipe = project()

    def stages(done) -> dict[str, str]:
        assert done.returncode == 0, done.stderr
        return {s["name"]: s["status"] for s in json.loads(done.stdout)["variants"][0]["stages"]}

    assert stages(run("run", recipe, "--json", env=env)[0])["optimize"] == "ran"
    assert run("run", recipe, "--json", env=env)[1]  # nothing changed: replayed
    source.write_text(PLUGIN + "# an edit to the pass's module\n")
    done, replayed, _ = run("run", recipe, "--json", env=env)
    assert not replayed and stages(done)["optimize"] == "ran"
