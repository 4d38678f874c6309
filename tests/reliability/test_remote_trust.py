"""What a remote entry is trusted with: only the files its stage kind produces (always), and —
when a signing key is set — only manifests signed with that key. Two "machines" (separate local
stores) share a file:// remote; a third party rewrites entries in it as whoever can write the
bucket could."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import edgebuild, log_lines
from remote_support import s3  # noqa: F401  (a fixture)

pytest.importorskip("fsspec")

SECRET = "0123456789abcdef0123456789abcdef"


def machine(tmp_path: Path, name: str, *, signing: str | None = None) -> dict:
    env = {"EDGEBUILD_CACHE_DIR": str(tmp_path / f"cache-{name}"), "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
           "EDGEBUILD_CACHE_SIGNING_KEY": signing or ""}
    return env


def stages(done) -> dict[str, dict]:
    (variant,) = json.loads(done.stdout)["variants"]
    return {s["name"]: s for s in variant["stages"]}


def forge(shared: Path, key: str, change) -> None:
    """Rewrite the remote entry ``key`` consistently: ``change(out_dir)`` edits its files, then the
    manifest gets their true sizes and digests (its signature, if any, is kept: the forger has no key)."""
    from edgebuild.store.local import manifest_digest

    entry = shared / "objects" / key[:2] / key
    change(entry / "out")
    meta = json.loads((entry / "meta.json").read_text())
    files = {}
    for path in sorted((entry / "out").rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            files[path.relative_to(entry / "out").as_posix()] = {
                "size": len(data), "mtime_ns": 0, "sha256": hashlib.sha256(data).hexdigest()}
    meta.update(files=files, digest=manifest_digest(files))
    (entry / "meta.json").write_text(json.dumps(meta))


def add_evil(out: Path) -> None:
    (out / "model" / "evil.sh").write_text("#!/bin/sh\ntouch PWNED\n")


def swap_model(out: Path) -> None:
    model = out / "model" / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\0forged")


@pytest.fixture
def shared(tmp_path) -> Path:
    return tmp_path / "shared"


def first_build(project, tmp_path, shared, *, signing=None) -> tuple[dict, bytes]:
    done = edgebuild("run", project(), "--json", "--remote", shared.as_uri(),
                     env=machine(tmp_path, "a", signing=signing), check=0)
    model = Path("out/default/model/model.onnx").read_bytes()
    Path("out").rename("out-a")
    return stages(done), model


@pytest.mark.parametrize("signing", [None, SECRET], ids=["unsigned", "signed"])
def test_an_entry_listing_a_file_its_stage_does_not_produce_is_never_installed(project, tmp_path, shared, signing):
    built, model = first_build(project, tmp_path, shared, signing=signing)
    forge(shared, built["package"]["key"], add_evil)
    second = edgebuild("run", project(), "--json", "--remote", shared.as_uri(),
                       env=machine(tmp_path, "b", signing=signing), check=0)
    assert stages(second)["package"]["status"] == "ran"  # built locally instead
    assert stages(second)["lower"]["status"] == "pulled"
    # with a key the forged manifest's signature fails first; without one, its layout does
    assert ("has a signature that does not match its manifest; not installed" if signing else
            "lists out/model/evil.sh, which its stage does not produce; not installed") in second.stderr
    assert not Path("out/default/model/evil.sh").exists()
    assert Path("out/default/model/model.onnx").read_bytes() == model
    assert not list((tmp_path / "cache-b").rglob("evil.sh"))


def test_cache_pull_installs_nothing_a_run_then_serves_outside_the_layout(project, tmp_path, shared):
    """`cache pull` knows no stage kinds; the run that would use the entry checks it and rebuilds."""
    built, model = first_build(project, tmp_path, shared)
    forge(shared, built["package"]["key"], add_evil)
    edgebuild("cache", "pull", built["package"]["key"], "--remote", shared.as_uri(),
              env=machine(tmp_path, "b"), check=0)
    second = edgebuild("run", project(), "--json", "--no-remote", env=machine(tmp_path, "b"), check=0)
    assert stages(second)["package"]["status"] == "ran"
    assert not Path("out/default/model/evil.sh").exists()
    assert Path("out/default/model/model.onnx").read_bytes() == model


def test_a_consistently_forged_entry_is_pulled_without_signing(project, tmp_path, shared):
    """The trust model without a key: digests show an entry is what its manifest says, no more."""
    built, model = first_build(project, tmp_path, shared)
    forge(shared, built["package"]["key"], swap_model)
    second = edgebuild("run", project(), "--json", "--remote", shared.as_uri(), env=machine(tmp_path, "b"), check=0)
    assert stages(second)["package"]["status"] == "pulled"
    assert Path("out/default/model/model.onnx").read_bytes() == model + b"\0forged"


def test_a_consistently_forged_entry_is_refused_with_signing(project, tmp_path, shared):
    built, model = first_build(project, tmp_path, shared, signing=SECRET)
    meta = json.loads((shared / "objects" / built["lower"]["key"][:2] / built["lower"]["key"] / "meta.json").read_text())
    assert meta["signature"]["algorithm"] == "hmac-sha256"  # the push signed what it uploaded
    forge(shared, built["package"]["key"], swap_model)
    runs = len(log_lines(tmp_path / "log.txt"))
    second = edgebuild("run", project(), "--json", "--remote", shared.as_uri(),
                       env=machine(tmp_path, "b", signing=SECRET), check=0)
    assert stages(second)["package"]["status"] == "ran" and stages(second)["lower"]["status"] == "pulled"
    assert f"entry {built['package']['key'][:12]} (package) has a signature that does not match its manifest" \
        in second.stderr
    assert Path("out/default/model/model.onnx").read_bytes() == model
    assert log_lines(tmp_path / "log.txt")[runs:] == ["package"]


@pytest.mark.parametrize("pusher, reason", [(None, "is not signed"), ("another-key-0123456789abcdef", "is signed with another key")])
def test_entries_not_signed_with_the_key_are_built_locally(project, tmp_path, shared, pusher, reason):
    built, model = first_build(project, tmp_path, shared, signing=pusher)
    second = edgebuild("run", project(), "--json", "--remote", shared.as_uri(),
                       env=machine(tmp_path, "b", signing=SECRET), check=0)
    assert {s["status"] for name, s in stages(second).items() if name != "resolve"} == {"ran"}
    assert f"entry {built['lower']['key'][:12]} (lower) {reason}; not installed" in second.stderr
    assert "EDGEBUILD_CACHE_SIGNING_KEY is set" in second.stderr
    assert Path("out/default/model/model.onnx").read_bytes() == model
    # its pushes replaced them with signed entries: a third machine with the key pulls everything
    third = edgebuild("run", project(), "--json", "--remote", shared.as_uri(),
                      env=machine(tmp_path, "c", signing=SECRET), check=0)
    assert {s["status"] for name, s in stages(third).items() if name != "resolve"} == {"pulled"}


def test_a_short_signing_key_is_a_usage_error(project, tmp_path, shared):
    done = edgebuild("run", project(), "--remote", shared.as_uri(), env=machine(tmp_path, "a", signing="short"))
    assert done.returncode == 2 and "EDGEBUILD_CACHE_SIGNING_KEY is 5 bytes long" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_signed_entry_still_holds_only_its_stages_files(project, tmp_path, shared):
    """A valid signature says who pushed an entry, not that its stage could have written it."""
    from edgebuild.store import signing

    built, model = first_build(project, tmp_path, shared, signing=SECRET)
    key = built["package"]["key"]
    forge(shared, key, add_evil)
    meta_path = shared / "objects" / key[:2] / key / "meta.json"
    meta_path.write_text(json.dumps(signing.sign(key, json.loads(meta_path.read_text()), SECRET.encode())))
    second = edgebuild("run", project(), "--json", "--remote", shared.as_uri(),
                       env=machine(tmp_path, "b", signing=SECRET), check=0)
    assert stages(second)["package"]["status"] == "ran"
    assert "lists out/model/evil.sh, which its stage does not produce; not installed" in second.stderr
    assert not Path("out/default/model/evil.sh").exists()


def test_signed_entries_on_s3(project, tmp_path, s3):
    """The same over an S3 API (moto's server): signed manifests are uploaded whole, as objects."""
    url = s3.make_bucket("signed")
    first = edgebuild("run", project(), "--json", "--remote", url, env=machine(tmp_path, "a", signing=SECRET), check=0)
    key = stages(first)["lower"]["key"]
    meta = json.loads(s3.client().get_object(Bucket="signed", Key=f"edgebuild/objects/{key[:2]}/{key}/meta.json")
                      ["Body"].read())
    assert meta["signature"]["algorithm"] == "hmac-sha256"
    second = edgebuild("run", project(), "--json", "--remote", url, env=machine(tmp_path, "b", signing=SECRET), check=0)
    assert {s["status"] for n, s in stages(second).items() if n != "resolve"} == {"pulled"}, second.stderr
    other = edgebuild("run", project(), "--json", "--remote", url,
                      env=machine(tmp_path, "c", signing="another-key-0123456789abcdef"), check=0)
    assert stages(other)["lower"]["status"] == "ran"
    assert f"entry {key[:12]} (lower) is signed with another key; not installed" in other.stderr
