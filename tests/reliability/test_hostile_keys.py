"""A stage key from outside — the command line, a lock file, a remote listing — becomes a path
only once it is one: 64 lowercase hex digits. Anything else is exit 2 naming the value (CLI, lock
files) or skipped with a warning naming the remote, and nothing is evicted or deleted for it.

Reproductions: `cache pull /etc/passwd --remote …` deleted the file (here: a victim file beside
the sandbox), `cache pull DIR` the directory, `cache push FILE` the file, `..` the folder holding
the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import assert_usage_error, edgebuild

pytest.importorskip("fsspec")

VICTIM_TEXT = "a file edgebuild does not own\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build with a file:// remote, copied into each test's sandbox (a build per test is slow)."""
    import os

    from edgebuild_testplugin.models import tiny_model
    from edgebuild_testplugin.recipes import RECIPE

    root = tmp_path_factory.mktemp("built")
    tiny_model(root / "tiny.onnx")
    (root / "recipe.yaml").write_text(RECIPE.format(extra=""))
    env = {"EDGEBUILD_CACHE_DIR": str(root / "cache"), "XDG_CONFIG_HOME": str(root / "no-config"),
           "EDGEBUILD_TEST_LOG": os.devnull}
    done = edgebuild("run", "recipe.yaml", "--json", "--remote", (root / "shared").as_uri(), env=env, cwd=root,
                     check=0)
    return root, {s["name"]: s["key"] for s in json.loads(done.stdout)["variants"][0]["stages"]}


@pytest.fixture
def sandbox(built, tmp_path, monkeypatch):
    """The built project, its store and a file:// remote holding its entries, beside a victim
    file and a victim folder that nothing may touch."""
    import shutil

    source, keys = built
    for name in ("tiny.onnx", "recipe.yaml"):
        shutil.copy(source / name, tmp_path / name)
    for name in ("cache", "shared", "out"):
        shutil.copytree(source / name, tmp_path / name, symlinks=True)
    (tmp_path / "victim.txt").write_text(VICTIM_TEXT)
    (tmp_path / "victim-dir").mkdir()
    (tmp_path / "victim-dir" / "keep.txt").write_text(VICTIM_TEXT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    return {"root": tmp_path, "remote": (tmp_path / "shared").as_uri(), "keys": keys}


def victims_intact(root: Path) -> None:
    assert (root / "victim.txt").read_text() == VICTIM_TEXT
    assert (root / "victim-dir" / "keep.txt").read_text() == VICTIM_TEXT
    assert (root / "cache" / "objects").is_dir() and (root / "shared" / "objects").is_dir()


def hostile_keys(root: Path) -> list:
    return [
        pytest.param(str(root / "victim.txt"), id="victim-file"),
        pytest.param(str(root / "victim-dir"), id="victim-dir"),
        pytest.param("..", id="dotdot"),
        pytest.param("../victim.txt", id="relative"),
        pytest.param("", id="empty"),
        pytest.param("ab\0cd", id="nul"),
        pytest.param("a" * 5000, id="5000-chars"),
        pytest.param("A" * 64, id="uppercase-hex"),
        pytest.param("a" * 63, id="63-hex"),
        pytest.param("a" * 64 + "\n", id="newline"),
        pytest.param("$(touch PWNED)", id="shell"),
    ]


@pytest.mark.parametrize("command", ["pull", "push"])
@pytest.mark.parametrize("index", range(11))
def test_cache_pull_and_push_refuse_what_is_not_a_key(sandbox, cli, command, index):
    root = sandbox["root"]
    value = hostile_keys(root)[index].values[0]
    code, out, err = cli("cache", command, value, "--remote", sandbox["remote"])
    assert_usage_error(code, err, f"cache {command}: ", "is not a stage key", "64 lowercase hex digits")
    shown = repr(value)[:60]
    assert shown in err  # the message names the value (cut when long)
    victims_intact(root)
    assert not list(root.rglob("PWNED"))
    # a real key on the same command line is not reached either: the check comes first
    code, _, err = cli("cache", command, sandbox["keys"]["lower"], value, "--remote", sandbox["remote"])
    assert code == 2, err


def test_the_store_makes_no_path_of_a_bad_key(sandbox):
    from edgebuild.store.local import BadKey, Store

    store = Store(sandbox["root"] / "cache")
    for value in ("..", "../..", str(sandbox["root"] / "victim.txt"), "", "A" * 64, "a" * 63, None, 12):
        for call in (store.lookup, store.evict, lambda k: store.build(k, "x", lambda out: {})):
            with pytest.raises(BadKey):
                call(value)
    victims_intact(sandbox["root"])


def test_a_tampered_lock_file_pulls_nothing(sandbox, cli):
    root = sandbox["root"]
    lock = json.loads(Path("out/default/edgebuild.lock.json").read_text())
    lock["stages"]["package"]["key"] = "../../victim.txt"
    (root / "tampered.lock.json").write_text(json.dumps(lock))
    code, _, err = cli("cache", "pull", "--lock", root / "tampered.lock.json", "--remote", sandbox["remote"])
    assert_usage_error(code, err, "tampered.lock.json: stages.'package'.key '../../victim.txt' is not a stage key",
                       "nothing was pulled")
    victims_intact(root)


def test_keys_from_lock_files_are_pulled(sandbox, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache-b"))
    lock = Path("out/default/edgebuild.lock.json")
    code, out, err = cli("cache", "pull", "--lock", lock, "--remote", sandbox["remote"], "--json")
    assert code == 0, err
    wanted = {k for name, k in sandbox["keys"].items() if name != "resolve"}
    assert json.loads(out)["pulled"] == len(wanted)
    assert {p.parent.name for p in (tmp_path / "cache-b" / "objects").glob("*/*/meta.json")} == wanted
    # a lock file that names no stage but resolve pulls nothing (not the whole remote)
    only_resolve = json.loads(lock.read_text())
    only_resolve["stages"] = {"resolve": only_resolve["stages"]["resolve"]}
    (tmp_path / "resolve.lock.json").write_text(json.dumps(only_resolve))
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache-c"))
    code, out, err = cli("cache", "pull", "--lock", tmp_path / "resolve.lock.json", "--remote", sandbox["remote"],
                         "--json")
    assert code == 0 and json.loads(out)["pulled"] == 0, err


@pytest.mark.parametrize("name", ["not-a-key", "A" * 64, "b" * 64, "..evil"])
def test_a_remote_listing_name_that_is_not_a_key_is_skipped(sandbox, cli, tmp_path, monkeypatch, name):
    """``b…b`` under ``aa/``: a key in the wrong folder is no entry either."""
    shared = tmp_path / "shared" / "objects"
    planted = shared / "aa" / name
    (planted / "out").mkdir(parents=True)
    (planted / "out" / "x").write_text("planted")
    (planted / "meta.json").write_text(json.dumps({"files": {}, "digest": "", "info": {}}))
    monkeypatch.setenv("EDGEBUILD_CACHE_DIR", str(tmp_path / "cache-b"))
    code, out, err = cli("cache", "status", "--remote", sandbox["remote"], "--json")
    assert code == 0, err
    assert f"warning: remote {sandbox['remote']}: skipped 'objects/aa/{name}': not a stage key" in err
    assert name not in out
    code, out, err = cli("cache", "pull", "--remote", sandbox["remote"], "--json")
    assert code == 0, err
    assert "skipped" in err and json.loads(out)["pulled"] == len(sandbox["keys"]) - 1  # every real entry
    assert not list((tmp_path / "cache-b" / "objects").glob(f"*/{name}"))
    victims_intact(tmp_path)
