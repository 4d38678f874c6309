"""Content-addressed store of stage outputs.

Layout under the cache root::

    objects/ab/abcdef.../out/...      the stage's output files
    objects/ab/abcdef.../meta.json    manifest (size, mtime, sha256 per file), digest, stage info
    locks/abcdef....lock              held while one process builds the entry

An entry is written into a temporary directory and renamed into place, so it is either
whole or absent. On read, each file's size and mtime are checked against the manifest; a
mismatch triggers a full re-hash, and an entry that fails it is evicted and rebuilt, never
served.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from edgebuild.dag.hashstate import sha256_of


@dataclass
class Entry:
    key: str
    path: Path  # the entry directory
    meta: dict

    @property
    def out(self) -> Path:
        return self.path / "out"

    @property
    def digest(self) -> str:
        return self.meta["digest"]

    @property
    def info(self) -> dict:
        return self.meta.get("info", {})


def manifest_digest(files: dict) -> str:
    canon = json.dumps({p: f["sha256"] for p, f in sorted(files.items())}, sort_keys=True)
    return hashlib.sha256(canon.encode()).hexdigest()


def scan(out: Path) -> dict:
    files = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            st = path.stat()
            files[path.relative_to(out).as_posix()] = {
                "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_of(path)
            }
    return files


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    def _dir(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / key

    def _lock(self, key: str) -> FileLock:
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / "locks" / f"{key}.lock"))

    # -- reading ------------------------------------------------------------------------
    def lookup(self, key: str) -> Entry | None:
        """The entry for ``key`` if present and intact; a corrupt one is evicted."""
        path = self._dir(key)
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError):
            self.evict(key)
            return None
        entry = Entry(key, path, meta)
        if not self._intact(entry):
            self.evict(key)
            return None
        return entry

    def _intact(self, entry: Entry) -> bool:
        files = entry.meta.get("files", {})
        present = {p.relative_to(entry.out).as_posix() for p in entry.out.rglob("*") if p.is_file()} if entry.out.exists() else set()
        if present != set(files):
            return False
        for rel, expected in files.items():
            st = (entry.out / rel).stat()
            if st.st_size != expected["size"]:
                return False
            if st.st_mtime_ns != expected["mtime_ns"] and sha256_of(entry.out / rel) != expected["sha256"]:
                return False
        return True

    def verify(self, entry: Entry) -> bool:
        """Full re-hash of every file (used before an entry's content is handed out)."""
        files = entry.meta.get("files", {})
        return all(sha256_of(entry.out / rel) == f["sha256"] for rel, f in files.items())

    # -- writing ------------------------------------------------------------------------
    def build(self, key: str, stage: str, produce: Callable[[Path], dict]) -> tuple[Entry, bool]:
        """Return (entry, built): the cached entry, or one made by ``produce(out_dir) -> info``.

        Holding the key's lock makes concurrent builders of one key wait for the first
        rather than build twice.
        """
        entry = self.lookup(key)
        if entry is not None:
            return entry, False
        with self._lock(key):
            entry = self.lookup(key)
            if entry is not None:
                return entry, False
            tmp_root = self.root / "tmp"
            tmp_root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=tmp_root, prefix=f"{key[:12]}-"))
            try:
                out = tmp / "out"
                out.mkdir()
                start = time.perf_counter()
                info = produce(out) or {}
                files = scan(out)
                meta = {
                    "key": key, "stage": stage, "created": time.time(),
                    "seconds": round(time.perf_counter() - start, 3),
                    "digest": manifest_digest(files), "files": files, "info": info,
                }
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
                final = self._dir(key)
                final.parent.mkdir(parents=True, exist_ok=True)
                if final.exists():  # a corrupt leftover that lookup() could not remove
                    shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return Entry(key, final, meta), True

    def evict(self, key: str) -> None:
        path = self._dir(key)
        if path.exists():
            trash = self.root / "tmp" / f"evict-{key[:12]}-{os.getpid()}-{time.time_ns()}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(path, trash)
            except OSError:
                return
            shutil.rmtree(trash, ignore_errors=True)

    # -- housekeeping -------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        result = []
        for meta_path in sorted((self.root / "objects").glob("*/*/meta.json")):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            result.append(Entry(meta_path.parent.name, meta_path.parent, meta))
        return result

    def size_of(self, entry: Entry) -> int:
        return sum(f["size"] for f in entry.meta.get("files", {}).values())

    def gc(self, *, max_age_days: float | None = None, max_bytes: int | None = None) -> list[Entry]:
        """Evict entries older than ``max_age_days`` (by last use), then the least recently used until under ``max_bytes``."""
        entries = sorted(self.entries(), key=lambda e: self.last_used(e))
        removed = []
        now = time.time()
        if max_age_days is not None:
            for entry in list(entries):
                if now - self.last_used(entry) > max_age_days * 86400:
                    self.evict(entry.key)
                    removed.append(entry)
                    entries.remove(entry)
        if max_bytes is not None:
            total = sum(self.size_of(e) for e in entries)
            for entry in list(entries):
                if total <= max_bytes:
                    break
                self.evict(entry.key)
                removed.append(entry)
                total -= self.size_of(entry)
        self._clean_tmp()
        if max_age_days is not None:
            self._clean_stamps(now - max_age_days * 86400)
        return removed

    def touch(self, entry: Entry) -> None:
        """Record a use, so gc evicts the least recently used first."""
        try:
            os.utime(entry.path / "meta.json")
        except OSError:
            pass

    @staticmethod
    def last_used(entry: Entry) -> float:
        try:
            return (entry.path / "meta.json").stat().st_mtime
        except OSError:
            return 0.0

    def clear(self) -> None:
        for sub in ("objects", "tmp", "locks", "stamps"):
            shutil.rmtree(self.root / sub, ignore_errors=True)

    def _clean_stamps(self, unused_since: float) -> None:
        """Drop up-to-date stamps (``edgebuild.uptodate``) not used since then; each is a small
        file per command line ever run, and a replay touches its own."""
        for stamp in (self.root / "stamps").glob("*.json"):
            try:
                if stamp.stat().st_mtime < unused_since:
                    stamp.unlink()
            except OSError:
                pass

    def _clean_tmp(self) -> None:
        """Remove temporaries of builds that were killed (older than a day)."""
        for tmp in (self.root / "tmp").glob("*"):
            if time.time() - tmp.stat().st_mtime > 86400:
                shutil.rmtree(tmp, ignore_errors=True)
