"""A remote cache on a shared mount (file://) and the same directory served read-only over http,
used by separate `edgebuild run` processes with separate local stores, as two machines would."""

from __future__ import annotations

import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import edgebuild, log_lines

pytest.importorskip("fsspec")


def statuses(done) -> dict[str, str]:
    (variant,) = json.loads(done.stdout)["variants"]
    return {s["name"]: s["status"] for s in variant["stages"]}


def machine(tmp_path: Path, name: str) -> dict:
    """The environment of another machine: its own local store."""
    return {"EDGEBUILD_CACHE_DIR": str(tmp_path / f"cache-{name}"), "XDG_CONFIG_HOME": str(tmp_path / "no-config")}


@pytest.fixture
def shared(tmp_path) -> str:
    return (tmp_path / "shared").as_uri()


def test_second_machine_pulls_every_stage_and_builds_nothing(project, tmp_path, shared):
    recipe = project()
    first = edgebuild("run", recipe, "--json", "--remote", shared, env=machine(tmp_path, "a"), check=0)
    assert set(statuses(first).values()) == {"ran", "cached"}  # resolve of a local file is "cached"
    built = log_lines(tmp_path / "log.txt")
    model = Path("out/default/model/model.onnx").read_bytes()
    Path("out").rename("out-a")
    second = edgebuild("run", recipe, "--json", "--remote", shared, env=machine(tmp_path, "b"), check=0)
    assert statuses(second) == {name: "cached" if name == "resolve" else "pulled" for name in statuses(first)}
    assert log_lines(tmp_path / "log.txt") == built  # no stage body ran on the second machine
    assert "warning" not in second.stderr
    keys = {s["key"] for s in json.loads(second.stdout)["variants"][0]["stages"] if s["name"] != "resolve"}
    assert {p.parent.name for p in (tmp_path / "shared" / "objects").glob("*/*/meta.json")} == keys
    assert Path("out/default/model/model.onnx").read_bytes() == model


def test_an_entry_without_its_manifest_is_invisible_until_a_push_completes_it(project, tmp_path, shared):
    recipe = project()
    first = edgebuild("run", recipe, "--json", "--remote", shared, env=machine(tmp_path, "a"), check=0)
    key = next(s["key"] for s in json.loads(first.stdout)["variants"][0]["stages"] if s["name"] == "package")
    # an upload killed before its manifest: files under the key, no meta.json, half a file beside them
    meta = tmp_path / "shared" / "objects" / key[:2] / key / "meta.json"
    meta.unlink()
    (meta.parent / "out" / "partial.tmp").write_bytes(b"half")
    status = edgebuild("cache", "status", "--json", "--remote", shared, env=machine(tmp_path, "a"), check=0)
    assert json.loads(status.stdout)["incomplete"] == [key]
    second = edgebuild("run", recipe, "--json", "--remote", shared, env=machine(tmp_path, "b"), check=0)
    assert statuses(second)["package"] == "ran" and statuses(second)["lower"] == "pulled"
    assert meta.exists()  # the second machine's push after its build completed the entry
    pushed = edgebuild("cache", "push", "--json", "--remote", shared, env=machine(tmp_path, "a"), check=0)
    assert json.loads(pushed.stdout)["pushed"] == 0
    status = edgebuild("cache", "status", "--json", "--remote", shared, env=machine(tmp_path, "c"), check=0)
    assert json.loads(status.stdout)["incomplete"] == [] and json.loads(status.stdout)["local"] == 0
    pulled = edgebuild("cache", "pull", "--json", "--remote", shared, env=machine(tmp_path, "c"), check=0)
    assert json.loads(pulled.stdout)["pulled"] == json.loads(status.stdout)["remote_entries"]


@pytest.fixture
def http_remote(tmp_path):
    """The file:// remote's directory served by a real http.server on 127.0.0.1."""
    (tmp_path / "shared").mkdir(exist_ok=True)
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "shared"))
    handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_read_only_http_remote_serves_pulls_and_takes_no_push(project, tmp_path, shared, http_remote):
    pytest.importorskip("aiohttp")
    recipe = project()
    edgebuild("run", recipe, "--json", "--remote", shared, env=machine(tmp_path, "a"), check=0)
    built = log_lines(tmp_path / "log.txt")
    reader = edgebuild("run", recipe, "--json", "--remote", http_remote, env=machine(tmp_path, "b"), check=0)
    assert set(statuses(reader).values()) == {"cached", "pulled"}
    assert log_lines(tmp_path / "log.txt") == built
    # a stage the remote lacks is built locally; over http nothing is pushed, and that is no error
    changed = edgebuild("run", project("compression: {level: 3}"), "--json", "--remote", http_remote,
                        env=machine(tmp_path, "b"), check=0)
    assert statuses(changed)["compress"] == "ran" and "warning" not in changed.stderr
    push = edgebuild("cache", "push", "--remote", http_remote, env=machine(tmp_path, "b"))
    assert push.returncode == 1 and "read-only" in push.stderr and "Traceback" not in push.stderr


def test_corrupt_file_remote_entry_is_reported_not_installed(project, tmp_path, shared):
    recipe = project()
    first = edgebuild("run", recipe, "--json", "--remote", shared, env=machine(tmp_path, "a"), check=0)
    key = next(s["key"] for s in json.loads(first.stdout)["variants"][0]["stages"] if s["name"] == "lower")
    model = Path("out/default/model/model.onnx").read_bytes()
    stored = tmp_path / "shared" / "objects" / key[:2] / key / "out" / "model" / "model.onnx"
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    stored.write_bytes(bytes(data))
    second = edgebuild("run", recipe, "--json", "--remote", shared, env=machine(tmp_path, "b"), check=0)
    assert statuses(second)["lower"] == "ran" and statuses(second)["optimize"] == "pulled"
    assert "does not match its manifest" in second.stderr and "not installed" in second.stderr
    assert Path("out/default/model/model.onnx").read_bytes() == model
    assert stored.read_bytes() == model  # the push after the local build replaced the bad copy
