"""Content-addressed store of stage outputs.

Layout under the cache root::

    objects/ab/abcdef.../out/...      the stage's output files (read-only once an output links them)
    objects/ab/abcdef.../meta.json    manifest (size, mtime, sha256 per file), digest, stage info
    locks/abcdef....lock              held while one process builds the entry
    tmp/abcdef....<random>            an entry being built (its key's lock is held meanwhile)
    tmp/evict-...                     an entry being removed
    leases/<id>.lock, <id>.keys       a running build's hold on the entries it uses (edgebuild.store.leases)
    state.db                          (inode, size, mtime_ns, ctime_ns) -> sha256 of verified files

An entry is written into a temporary directory and renamed into place, so it is either
whole or absent. It is served only while every file's digest is known good: hashed and found
equal to the manifest, or unchanged in (inode, size, mtime_ns, ctime_ns) since it last was —
the kernel sets ctime on every write, chmod or utime, so restoring an mtime does not hide an
edit (the rule of DVC's state and Bazel's digest cache). Anything else, including a
``meta.json`` that is not a valid manifest, makes the entry corrupt: it is evicted and rebuilt,
never served. A file an output hard-links is made read-only first (``seal``).

A key comes from outside (the command line, a lock file, a remote listing), so an entry's path
is made only by :func:`entry_path`, which refuses anything but a stage key (64 lowercase hex
digits): ``..`` or ``/etc/passwd`` never becomes a path that a lookup would evict. ``gc`` and
``clear`` leave alone the entries a running build holds (its lease names every key it looked up).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from edgebuild.errors import BuildError, UsageError
from edgebuild.store import hashstate, leases
from edgebuild.store.layout import outside
from edgebuild.store.atomic import file_mode, make_temp_dir, publish_tree

KEY = re.compile(r"[0-9a-f]{64}")
KEY_SHAPE = "a stage key is 64 lowercase hex digits (a sha256), as `edgebuild cache ls --json` and edgebuild.lock.json show them"
BUILDING = re.compile(r"(?P<key>[0-9a-f]{64})\..+")  # tmp/<key>.<random>
OLD_BUILDING = re.compile(r"[0-9a-f]{12}-.+")  # tmp names of earlier versions (no full key)
STAMP = re.compile(r"\.?[0-9a-f]{32}\.json(\.\d+\.tmp)?")  # edgebuild.build.uptodate's stamps
STAMP_BLOB = re.compile(r"\.?[0-9a-f]{64}(\.\d+\.tmp)?")  # stamps/blobs/: files they restore (edgebuild.build.restore)
STALE_SECONDS = 86400  # an old-style temporary this old belongs to no live build


class BadKey(UsageError):
    """A value given as a stage key that is not one (exit 2 on the command line)."""


def shown_value(value, limit: int = 80) -> str:
    """``value`` for a message: repr'd (a NUL or a newline shows as an escape), long ones cut."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} characters)"


def is_key(value) -> bool:
    return isinstance(value, str) and KEY.fullmatch(value) is not None


def check_key(value, where: str = "") -> str:
    """``value`` if it is a stage key, else BadKey naming it (``where``: e.g. ``"cache pull: "``)."""
    if not is_key(value):
        raise BadKey(f"{where}{shown_value(value)} is not a stage key", hint=KEY_SHAPE)
    return value


def entry_path(root: Path, key) -> Path:
    """The one way to make an entry's path: only from a valid key (BadKey otherwise)."""
    check_key(key)
    return Path(root) / "objects" / key[:2] / key


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


def scan(out: Path, stamps: dict | None = None) -> dict:
    """The manifest of the files under ``out``; ``stamps`` (if given) receives each file's stat
    stamp at hashing time, so the digest can be remembered once the files have moved."""
    files = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            # a file the producer vouched for (a copy of known bytes) is not read again
            digest, stamp = hashstate.hashed_once(path)
            rel = path.relative_to(out).as_posix()
            files[rel] = {"size": stamp[1], "mtime_ns": stamp[2], "sha256": digest}
            if stamps is not None:
                stamps[rel] = stamp
    return files


def valid_meta(key: str, meta) -> bool:
    """A manifest this version can trust the shape of (anything else is a corrupt entry)."""
    if not isinstance(meta, dict) or meta.get("key", key) != key or not isinstance(meta.get("info", {}), dict):
        return False
    files = meta.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(f, dict) and isinstance(f.get("size"), int) and isinstance(f.get("sha256"), str)
        for f in files.values()
    ):
        return False
    return meta.get("digest") == manifest_digest(files)


def seal(path: Path) -> bool:
    """Make a store file read-only (readable as the umask allows) so that an output may hard-link
    it: an edit of the output then needs a chmod first and cannot silently reach the store.
    False if the file cannot be sealed (a read-only store, another user's file): copy it instead.

    Only files an output links are sealed: a producer that copies an upstream file and rewrites
    the copy (coremltools' ``MLModel.save`` does) would be refused a read-only copy."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        if st.st_mode & 0o222:
            os.chmod(path, file_mode(writable=False))
        return True
    except OSError:
        return False


class Problems(list):
    """Paths a clean-up could not remove, as ``"path: reason"`` lines; ``held``: the keys of the
    entries it left alone because a running build holds them."""

    def __init__(self, *args):
        super().__init__(*args)
        self.held: list[str] = []

    def __iadd__(self, other):
        super().__iadd__(other)
        self.held += getattr(other, "held", [])
        return self

    def rmtree(self, path: Path) -> None:
        def failed(_func, failed_path, exc_info):
            if not isinstance(exc_info[1], FileNotFoundError):  # gone already: someone else removed it
                self.append(f"{failed_path}: {exc_info[1].strerror or exc_info[1]}")

        shutil.rmtree(path, onerror=failed)

    def unlink(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.append(f"{path}: {exc.strerror or exc}")


SOURCES = "sources"  # what resolvers fetched, by scheme (pypi/NAME==VER/..., https/SHA256/...)


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._lease: leases.Lease | bool | None = None  # taken on the first lookup, held while this object lives
        self._lease_guard = threading.Lock()  # one lease however many threads look up at once

    @property
    def sources(self) -> Path:
        """The folder resolvers fetch into (a resolver's ``workdir``): the store's, so ``clear``
        removes it with the rest and nothing else writes into the store's directory."""
        return self.root / SOURCES

    def _dir(self, key: str) -> Path:
        return entry_path(self.root, key)

    def _lock(self, key: str, timeout: float = -1) -> FileLock:
        check_key(key)
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / "locks" / f"{key}.lock"), timeout=timeout)

    # -- leases -------------------------------------------------------------------------
    def hold(self, key: str) -> None:
        """Note in this process's lease that it uses ``key``'s entry (before it looks it up), so
        housekeeping in another process leaves the entry alone until this store object is gone."""
        with self._lease_guard:
            if self._lease is None:
                self._lease = leases.Lease.take(self.root) or False  # False: this store cannot hold leases
            lease = self._lease
        if lease:
            lease.add(key)

    def release(self) -> None:
        """Give up the lease (also done when this object is collected, or the process ends)."""
        with self._lease_guard:
            lease, self._lease = self._lease, None
        if lease:
            lease.release()

    def held_keys(self) -> set[str]:
        """The keys every running build's lease holds (stale leases of ended processes are removed)."""
        return leases.held_keys(self.root)

    # -- reading ------------------------------------------------------------------------
    def lookup(self, key: str, layout=None) -> Entry | None:
        """The entry for ``key`` if present and intact; a corrupt one is evicted. BadKey for a
        value that is not a stage key (before any path is made of it). ``layout``: the files its
        stage may produce (edgebuild.store.layout); an entry holding others is evicted too."""
        path = self._dir(key)
        if not self.root.is_dir():
            return None  # a store never made (read-only commands do not make one) holds nothing to lease
        self.hold(key)
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (FileNotFoundError, NotADirectoryError):
            if path.exists():
                self.evict(key)  # an entry directory without a manifest
            return None
        except (OSError, ValueError):
            self.evict(key)
            return None
        entry = Entry(key, path, meta)
        if not valid_meta(key, meta) or outside(layout, meta["files"]) or not self._intact(entry):
            self.evict(key)
            return None
        return entry

    def _intact(self, entry: Entry) -> bool:
        """Every file present and known to hold the manifest's digest (see the module docstring)."""
        files = entry.meta["files"]
        present = {p.relative_to(entry.out).as_posix() for p in entry.out.rglob("*") if p.is_file()} if entry.out.exists() else set()
        if present != set(files):
            return False
        for rel, expected in files.items():
            path = entry.out / rel
            try:
                if path.stat().st_size != expected["size"]:
                    return False
                if hashstate.file_sha256(path) != expected["sha256"]:
                    return False
            except OSError:
                return False
        return True

    # -- writing ------------------------------------------------------------------------
    def build(self, key: str, stage: str, produce: Callable[[Path], dict], layout=None) -> tuple[Entry, bool]:
        """Return (entry, built): the cached entry, or one made by ``produce(out_dir) -> info``.

        Holding the key's lock makes concurrent builders of one key wait for the first
        rather than build twice. ``layout``: the files the stage may produce (see ``lookup``).
        """
        entry = self.lookup(key, layout)
        if entry is not None:
            return entry, False
        with self._lock(key):
            entry = self.lookup(key, layout)
            if entry is not None:
                return entry, False
            tmp_root = self.root / "tmp"
            tmp_root.mkdir(parents=True, exist_ok=True)
            tmp = make_temp_dir(tmp_root, f"{key}.")  # the key in the name lets gc ask its lock
            try:
                out = tmp / "out"
                out.mkdir()
                start = time.perf_counter()
                info = produce(out) or {}
                publish_tree(out)  # producers may stage directories with mkdtemp's 0700
                stamps: dict = {}
                files = scan(out, stamps)
                extra = outside(layout, files)
                if extra:
                    raise BuildError(f"stage {stage} wrote {extra[0]!r}, which its declared layout does not allow "
                                     f"({', '.join(layout)}); not stored",
                                     hint="the plugin that declares the stage must list every file it writes in "
                                          "Stage.extra['layout']")
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
            # a rename leaves the files' stat alone, so the digests just computed still vouch for them
            for rel, file_stamp in stamps.items():
                hashstate.remember(final / "out" / rel, file_stamp, files[rel]["sha256"])
            return Entry(key, final, meta), True

    def evict(self, key: str) -> Problems:
        """Remove an entry (moved aside first, so readers never see half of it)."""
        return self._remove_entry(self._dir(key))

    def _remove_entry(self, path: Path, *, unless_held: bool = False) -> Problems:
        """Remove an entry directory; ``unless_held`` (housekeeping): not if a running build holds
        its key. A build notes a key in its lease before it looks the entry up, so the second look
        after the entry is moved aside catches a build that started using it meanwhile: the entry
        is moved back, whole, before anything of it is deleted."""
        problems = Problems()
        if not path.exists():
            return problems
        if unless_held and path.name in self.held_keys():
            problems.held.append(path.name)
            return problems
        trash = self.root / "tmp" / f"evict-{path.name[:12]}-{os.getpid()}-{time.time_ns()}"
        try:
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, trash)
        except FileNotFoundError:
            return problems  # removed meanwhile by another process
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            return problems
        if unless_held and path.name in self.held_keys():
            try:
                os.replace(trash, path)
                problems.held.append(path.name)
                return problems
            except OSError:  # rebuilt meanwhile under its name: this copy is not the one in use
                pass
        try:
            hashstate.forget(path)
        except Exception:  # a locked or read-only state DB: its rows for gone files are harmless
            pass
        if trash.is_dir():
            problems.rmtree(trash)
        else:
            problems.unlink(trash)
        return problems

    # -- housekeeping -------------------------------------------------------------------
    def _entry_dirs(self) -> list[Path]:
        """Every directory the store made under objects/ (named by its key), intact or not."""
        return sorted(p for p in (self.root / "objects").glob("*/*")
                      if KEY.fullmatch(p.name) and p.parent.name == p.name[:2] and p.is_dir() and not p.is_symlink())

    def _scan_entries(self) -> tuple[list[Entry], list[Path]]:
        good, corrupt = [], []
        for path in self._entry_dirs():
            try:
                meta = json.loads((path / "meta.json").read_text())
            except (OSError, ValueError):
                meta = None
            if valid_meta(path.name, meta):
                good.append(Entry(path.name, path, meta))
            else:
                corrupt.append(path)
        return good, corrupt

    def entries(self) -> list[Entry]:
        """Entries whose manifest is valid (their files are checked when they are looked up)."""
        return self._scan_entries()[0]

    def corrupt(self) -> list[Path]:
        """Entry directories whose manifest is missing or invalid: never served, removed by gc."""
        return self._scan_entries()[1]

    def size_of(self, entry: Entry) -> int:
        return sum(f["size"] for f in entry.meta.get("files", {}).values())

    @staticmethod
    def bytes_under(path: Path) -> int:
        total = 0
        for folder, _, names in os.walk(path):
            for name in names:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    pass
        return total

    def leftovers(self) -> list[Path]:
        """Temporaries of builds and evictions that were killed (SIGTERM, SIGKILL, power loss)."""
        found = []
        for tmp in sorted((self.root / "tmp").glob("*")):
            building = BUILDING.fullmatch(tmp.name)
            if tmp.name.startswith("evict-"):
                found.append(tmp)  # moved aside to be deleted: garbage whoever made it
            elif building:
                try:
                    with self._lock(building["key"], timeout=0):  # its builder would hold this
                        found.append(tmp)
                except (Timeout, OSError):  # building, or a read-only store that cannot tell
                    pass
            elif OLD_BUILDING.fullmatch(tmp.name):
                try:
                    if time.time() - tmp.stat().st_mtime > STALE_SECONDS:
                        found.append(tmp)
                except OSError:
                    pass
        return found

    def gc(self, *, max_age_days: float | None = None, max_bytes: int | None = None) -> tuple[list[Entry], Problems]:
        """Remove corrupt entries and killed builds' temporaries; then evict entries older than
        ``max_age_days`` (by last use), then the least recently used until under ``max_bytes``.
        Returns the evicted entries and what could not be removed."""
        check_budget(max_age_days=max_age_days, max_bytes=max_bytes)
        entries, corrupt = self._scan_entries()
        entries.sort(key=self.last_used)
        problems = Problems()
        for path in corrupt:
            problems += self._remove_entry(path, unless_held=True)
        removed = []
        now = time.time()
        if max_age_days is not None:
            for entry in list(entries):
                if now - self.last_used(entry) > max_age_days * 86400:
                    failed = self._remove_entry(entry.path, unless_held=True)
                    problems += failed
                    if not failed.held:
                        entries.remove(entry)
                        if not failed:
                            removed.append(entry)
        if max_bytes is not None:
            total = sum(self.size_of(e) for e in entries)
            for entry in list(entries):
                if total <= max_bytes:
                    break
                if entry.key in problems.held:
                    continue  # a running build's: it stays, however old
                failed = self._remove_entry(entry.path, unless_held=True)
                problems += failed
                if not failed and not failed.held:
                    removed.append(entry)
                    total -= self.size_of(entry)
        for tmp in self.leftovers():
            problems.rmtree(tmp)
        if max_age_days is not None:
            self._clean_stamps(now - max_age_days * 86400, problems)
        return removed, problems

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

    def clear(self) -> Problems:
        """Remove every entry, temporary, lock and stamp — only what the store made, by its names,
        so files someone else put in the cache directory stay. Returns what could not be removed."""
        problems = Problems()
        for path in self._entry_dirs():
            problems += self._remove_entry(path, unless_held=True)
        live = set(self.leftovers())  # what killed builds left: not a running build's temporary
        for tmp in (self.root / "tmp").glob("*"):
            if tmp.name.startswith("evict-") or tmp in live:
                if tmp.is_dir() and not tmp.is_symlink():
                    problems.rmtree(tmp)
        held = set(problems.held)
        for lock in (self.root / "locks").glob("*.lock"):
            if KEY.fullmatch(lock.stem) and lock.stem not in held and not self._locked(lock.stem):
                problems.unlink(lock)
        leases.remove_stale(self.root, problems)
        self._clean_stamps(float("inf"), problems)
        for folder in [*(self.root / "objects").glob("*"),
                       *(self.root / d for d in ("objects", "tmp", "locks", "stamps/blobs", "stamps", leases.FOLDER))]:
            try:
                folder.rmdir()  # only if nothing else is left in it
            except OSError:
                pass
        return problems

    def _locked(self, key: str) -> bool:
        """Whether a builder holds ``key``'s lock now (its lock file must then stay)."""
        try:
            with self._lock(key, timeout=0):
                return False
        except (Timeout, OSError):
            return True

    def _clean_stamps(self, unused_since: float, problems: Problems) -> None:
        """Drop up-to-date stamps (``edgebuild.build.uptodate``) not used since then; each is a small
        file per command line ever run. A replay touches its stamp and the blobs it would restore
        outputs from (``stamps/blobs/``), so a stamp kept keeps its blobs; a blob missing only
        means a full run."""
        for pattern, folder in ((STAMP, self.root / "stamps"), (STAMP_BLOB, self.root / "stamps" / "blobs")):
            for stamp in folder.glob("*"):
                try:
                    if pattern.fullmatch(stamp.name) and stamp.lstat().st_mtime < unused_since:
                        problems.unlink(stamp)
                except OSError:
                    pass



def check_budget(*, max_age_days=None, max_bytes=None, age_option: str = "max_age_days",
                 size_option: str = "max_bytes") -> None:
    """gc's limits are finite numbers >= 0: a negative one would evict everything, NaN nothing."""
    import math

    for option, value, example in ((age_option, max_age_days, "30"), (size_option, max_bytes, "5G")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise UsageError(f"cache gc: {option} {shown_value(value)} must be a finite number >= 0",
                             hint=f"e.g. {option} {example}")


SIZE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def parse_size(text: str, option: str = "--max-size") -> int:
    """Bytes from ``500M``, ``5G``, ``1.5GiB``, ``1000``; UsageError for a negative, infinite or
    unreadable size."""
    if str(text).strip().startswith("-"):
        raise UsageError(f"cache gc: {option} {shown_value(text)} must be >= 0 (a negative budget would evict "
                         "everything)", hint=f"e.g. {option} 5G")
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*", str(text), re.I)
    if not match:
        raise UsageError(f"cache gc: {option} {shown_value(text)} is not a size", hint=f"e.g. {option} 500M or 5G")
    size = float(match[1]) * SIZE_UNITS[(match[2] or "").lower()]
    check_budget(max_bytes=size, size_option=option)
    return int(size)
