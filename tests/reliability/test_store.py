"""The content-addressed store never serves a corrupt entry and never jams: files edited with
their mtime restored are caught (ctime), broken manifests are rebuilt by ``run`` and shown and
removed by ``cache``, killed builds' temporaries are reclaimed, ``clear`` removes only what the
store made, and a clean-up that cannot remove something says so and fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild_testplugin.cli_runner import edgebuild, run_until_stage

ARTIFACT = Path("out/default/model/model.onnx")


def stage_keys(done_stdout: str) -> dict[str, str]:
    (variant,) = json.loads(done_stdout)["variants"]
    return {s["name"]: s["key"] for s in variant["stages"]}


def statuses(done_stdout: str) -> dict[str, str]:
    (variant,) = json.loads(done_stdout)["variants"]
    return {s["name"]: s["status"] for s in variant["stages"]}


def entry_dir(tmp_path: Path, key: str) -> Path:
    return tmp_path / "cache" / "objects" / key[:2] / key


def flip_64_bytes_keep_mtime(path: Path) -> None:
    """Corrupt ``path`` in place the way a stray tool would, then hide it: same size, same
    mode, same mtime (only the kernel-kept ctime moves)."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2 - 32
    for i in range(middle, middle + 64):
        data[i] ^= 0xFF
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:  # in place: same inode, so hard links see it too
        handle.write(bytes(data))
    os.chmod(path, st.st_mode)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_size == st.st_size


# -- 2. a corrupt entry is never served ----------------------------------------------------

def test_corrupt_delivered_artifact_with_restored_mtime_is_rebuilt_as_a_user_runs_it(project, tmp_path):
    """The seen failure: 64 bytes flipped in a store file (here through the output's hard link),
    mtime restored; the next run, no-op fast path included, must not deliver it."""
    recipe = project()
    first = edgebuild("run", recipe, "--json", check=0)
    good = ARTIFACT.read_bytes()
    store_file = entry_dir(tmp_path, stage_keys(first.stdout)["package"]) / "out" / "model" / "model.onnx"
    assert os.path.samefile(store_file, ARTIFACT)
    flip_64_bytes_keep_mtime(ARTIFACT)
    assert store_file.read_bytes() != good  # the store file is the same inode
    second = edgebuild("run", recipe, "--json", check=0)
    assert statuses(second.stdout)["package"] == "ran"
    assert ARTIFACT.read_bytes() == good and store_file.read_bytes() == good
    assert statuses(edgebuild("run", recipe, "--json", check=0).stdout)["package"] == "cached"


@pytest.mark.parametrize("stage", ["import", "optimize", "lower", "package"])
def test_corrupt_store_file_with_restored_mtime_reruns_its_stage(project, tmp_path, cli, stage):
    recipe = project()
    code, out, err = cli("run", recipe, "--json")
    assert code == 0, err
    good = ARTIFACT.read_bytes()
    entry = entry_dir(tmp_path, stage_keys(out)[stage])
    (victim,) = [p for p in (entry / "out").rglob("*") if p.is_file() and p.stat().st_size >= 128][:1]
    flip_64_bytes_keep_mtime(victim)
    code, out, err = cli("run", recipe, "--json")
    assert code == 0, err
    assert statuses(out)[stage] == "ran"
    assert ARTIFACT.read_bytes() == good


def test_entry_is_served_by_stat_only_while_inode_size_mtime_and_ctime_are_unchanged(tmp_path, monkeypatch):
    """Verified files are not re-hashed on every lookup; any ctime change forces a re-hash."""
    from edgebuild.store import hashstate
    from edgebuild.store.local import Store

    hashstate.configure(tmp_path / "state.db")
    store = Store(tmp_path / "store")
    key = "ab" * 32
    entry, built = store.build(key, "lower", lambda out: (out / "w.bin").write_bytes(os.urandom(4096)) and {})
    assert built
    reads = []
    real = hashstate.sha256_of
    monkeypatch.setattr(hashstate, "sha256_of", lambda p: reads.append(p) or real(p))
    assert store.lookup(key) is not None and reads == []  # verified when built, stat unchanged
    path = entry.out / "w.bin"
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, but ctime moves
    assert store.lookup(key) is not None and len(reads) == 1  # re-hashed, found good
    flip_64_bytes_keep_mtime(path)
    assert store.lookup(key) is None  # re-hashed, found bad: evicted, not served
    assert not entry.path.exists()


@pytest.mark.parametrize("slow", [False, True], ids=["small-pieces", "switching-to-large"])
@pytest.mark.parametrize("size", [0, 1, 7, 16, 23, 100])
def test_file_digest_reads_in_chunks_and_equals_hashlibs(tmp_path, monkeypatch, size, slow):
    import hashlib

    from edgebuild.store import hashstate

    monkeypatch.setattr(hashstate, "_SMALL_PIECE", 3)
    monkeypatch.setattr(hashstate, "_CHUNK", 8)  # several reads and a short last one
    monkeypatch.setattr(hashstate, "_SLOW_PIECE_SECONDS", -1.0 if slow else 60.0)
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert hashstate.sha256_of(tmp_path / "f") == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("slow", [False, True])
def test_a_hash_whose_pieces_wait_switches_to_large_reads(tmp_path, monkeypatch, slow):
    from edgebuild.store import hashstate

    monkeypatch.setattr(hashstate, "_SMALL_PIECE", 2)
    monkeypatch.setattr(hashstate, "_MIN_CHUNK", 10)
    monkeypatch.setattr(hashstate, "_SLOW_PIECE_SECONDS", -1.0 if slow else 60.0)  # every piece waits, or none
    (tmp_path / "f").write_bytes(os.urandom(50))
    with open(tmp_path / "f", "rb", buffering=0) as handle:
        sizes = [len(piece) for piece in hashstate._pieces(handle, 50)]
    assert sum(sizes) == 50
    assert sizes == ([2] * hashstate._SLOW_PIECES + [10, 10, 10, 10, 2] if slow else [2] * 25)


def test_delivered_store_files_are_read_only_and_others_keep_their_mode(project, tmp_path, cli):
    """Producers may copy an upstream file and rewrite the copy (coremltools' save does), so only
    what an output links is sealed."""
    code, out, err = cli("run", project(), "--json")
    assert code == 0, err
    keys = stage_keys(out)
    delivered = entry_dir(tmp_path, keys["package"]) / "out" / "model" / "model.onnx"
    assert os.path.samefile(delivered, ARTIFACT) and not delivered.stat().st_mode & 0o222
    upstream = entry_dir(tmp_path, keys["lower"]) / "out" / "model" / "model.onnx"
    assert upstream.stat().st_mode & 0o200


# -- 3. a broken entry never jams the store --------------------------------------------------

BROKEN_MANIFESTS = {
    "list": lambda meta: [],
    "string": lambda meta: "meta",
    "null": lambda meta: None,
    "empty object": lambda meta: {},
    "no files": lambda meta: {k: v for k, v in meta.items() if k != "files"},
    "no digest": lambda meta: {k: v for k, v in meta.items() if k != "digest"},
    "files is a list": lambda meta: {**meta, "files": list(meta["files"])},
    "file without sha256": lambda meta: {**meta, "files": {p: {"size": f["size"]} for p, f in meta["files"].items()}},
    "digest disagrees": lambda meta: {**meta, "digest": "0" * 64},
    "info is a string": lambda meta: {**meta, "info": "x"},
}


def break_manifest(entry: Path, how: str) -> None:
    meta_path = entry / "meta.json"
    if how == "missing":
        meta_path.unlink()
    elif how == "not json":
        meta_path.write_text("{\"key\": ")
    else:
        meta_path.write_text(json.dumps(BROKEN_MANIFESTS[how](json.loads(meta_path.read_text()))))


@pytest.mark.parametrize("how", ["missing", "not json", *BROKEN_MANIFESTS])
def test_broken_manifest_is_rebuilt_by_run_and_shown_and_removed_by_cache(project, tmp_path, cli, how):
    recipe = project()
    code, out, err = cli("run", recipe, "--json")
    assert code == 0, err
    entry = entry_dir(tmp_path, stage_keys(out)["lower"])
    break_manifest(entry, how)

    code, out, err = cli("cache", "info", "--json")
    assert code == 0 and json.loads(out)["corrupt"] == 1, err
    code, out, err = cli("cache", "ls", "--json")
    assert code == 0, err
    assert [r["key"] for r in json.loads(out) if r["status"] == "corrupt"] == [entry.name]
    code, out, err = cli("cache", "ls")
    assert code == 0 and "CORRUPT" in out, err

    code, out, err = cli("run", recipe, "--json")
    assert code == 0, err
    assert statuses(out)["lower"] == "ran"
    assert json.loads((entry / "meta.json").read_text())["digest"]  # a whole entry again

    break_manifest(entry, how)
    code, out, err = cli("cache", "gc")
    assert code == 0 and "removed 1 corrupt" in out, err
    assert not entry.exists()
    code, out, err = cli("cache", "info", "--json")
    assert json.loads(out)["corrupt"] == 0 and json.loads(out)["entries"] >= 3


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_temporaries_of_killed_builds_are_counted_and_reclaimed(project, tmp_path, sig):
    recipe = project()
    proc = run_until_stage(recipe, tmp_path / "log.txt", "lower", sleep=60)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    left = list((tmp_path / "cache" / "tmp").glob("*"))
    info = json.loads(edgebuild("cache", "info", "--json", check=0).stdout)
    assert info["temporaries"] == len(left)
    if sig == signal.SIGKILL:
        assert len(left) >= 1 and info["garbage_bytes"] >= 0
    done = edgebuild("cache", "gc", check=0)
    assert f"{len(left)} temporaries" in done.stdout
    assert not list((tmp_path / "cache" / "tmp").glob("*"))
    assert json.loads(edgebuild("cache", "info", "--json", check=0).stdout)["temporaries"] == 0
    edgebuild("run", recipe, check=0)


def test_temporary_of_a_live_build_is_left_alone(tmp_path):
    from edgebuild.store import hashstate
    from edgebuild.store.local import Store

    hashstate.configure(tmp_path / "state.db")
    store = Store(tmp_path / "store")
    key = "cd" * 32
    building = tmp_path / "store" / "tmp" / f"{key}.live"
    building.mkdir(parents=True)
    with store._lock(key):  # as Store.build holds it while it writes the temporary
        assert store.leftovers() == []
        store.gc()
        assert building.is_dir()
    assert store.leftovers() == [building]
    store.gc()
    assert not building.exists()


def test_clear_removes_only_what_the_store_made(project, tmp_path, cli):
    code, _, err = cli("run", project())
    assert code == 0, err
    cache = tmp_path / "cache"
    mine = [cache / "notes.txt", cache / "tmp" / "mine.txt", cache / "objects" / "README",
            cache / "objects" / "ab" / "not-a-key", cache / "locks" / "mine.txt", cache / "stamps" / "keep.json",
            cache / "tmp" / "my-dir" / "file"]
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("a user's")
    assert json.loads(cli("cache", "info", "--json")[1])["entries"] >= 4
    code, out, err = cli("cache", "clear")
    assert code == 0 and "cleared" in out, err
    assert json.loads(cli("cache", "info", "--json")[1])["entries"] == 0
    assert all(p.read_text() == "a user's" for p in mine)


# -- 13. clean-ups on a read-only store say what they could not remove ------------------------

@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions, so chmod cannot make the "
                    "store read-only; the reporting is tested below with removal failing another way")
@pytest.mark.parametrize("command", [["gc", "--max-size", "1"], ["clear"]])
def test_clean_up_of_a_read_only_store_fails_and_says_what_stayed(project, tmp_path, command):
    edgebuild("run", project(), check=0)
    folders = [p for p in (tmp_path / "cache" / "objects").glob("*") if p.is_dir()]
    for folder in folders:
        folder.chmod(0o555)
    try:
        done = edgebuild("cache", *command)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "could not remove" in done.stderr and "cleared" not in done.stdout
    assert json.loads(edgebuild("cache", "info", "--json", check=0).stdout)["entries"] >= 4


@pytest.mark.parametrize("command", [["gc", "--max-size", "1"], ["clear"]])
@pytest.mark.parametrize("failing", ["rename", "unlink"])
def test_clean_up_that_cannot_remove_fails_and_says_what_stayed(project, tmp_path, cli, monkeypatch, command, failing):
    """Removal refused by the OS (as on a read-only or immutable store): simulated by making
    os.replace / os.unlink raise PermissionError for paths in the store."""
    code, _, err = cli("run", project())
    assert code == 0, err
    cache = str(tmp_path / "cache")
    target = {"rename": "replace", "unlink": "unlink"}[failing]
    real = getattr(os, target)

    def refuse(src, *args, **kwargs):
        where = src if isinstance(src, (str, Path)) else ""
        if cache in str(where) or kwargs.get("dir_fd") is not None:
            raise PermissionError(13, "Permission denied", str(where))
        return real(src, *args, **kwargs)

    monkeypatch.setattr(os, target, refuse)
    code, out, err = cli("cache", *command)
    monkeypatch.setattr(os, target, real)
    assert code == 1, out + err
    assert "could not remove" in err and "Permission denied" in err and "hint:" in err
    assert "cleared" not in out and "evicted" not in out


def test_a_locked_state_db_means_hashing_again_not_failing(tmp_path, monkeypatch):
    import hashlib
    import sqlite3

    from edgebuild.store import hashstate

    monkeypatch.setattr(hashstate, "_LOCK_TIMEOUT", 0.05)
    db = tmp_path / "state.db"
    hashstate.configure(db)
    try:
        data = tmp_path / "weights.bin"
        data.write_bytes(b"\x01" * 4096)
        expected = hashlib.sha256(data.read_bytes()).hexdigest()
        assert hashstate.file_sha256(data) == expected  # creates the table and remembers the digest
        hashstate.configure(db)  # a fresh connection, as another thread would have
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process writing, past our timeout
        data.write_bytes(b"\x02" * 4096)
        assert hashstate.file_sha256(data) == hashlib.sha256(data.read_bytes()).hexdigest()
        hashstate.forget(tmp_path)  # an eviction's clean-up does not fail either
        holder.execute("ROLLBACK")
        holder.close()
    finally:
        hashstate.configure(None)
