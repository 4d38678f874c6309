"""Leases: a running build's hold on the store entries it uses, so that ``cache gc`` and
``cache clear`` (in another process, or another thread) never remove an entry from under it.

Layout under the store root::

    leases/<pid>-<random>.lock    a file lock, held by the build for as long as its lease lives
    leases/<pid>-<random>.keys    the keys it uses, one a line, each added before it is looked up

The lock is an OS file lock, which dies with its process: a build that crashed (SIGKILL, power
loss) holds nothing, and the next ``gc`` or ``clear`` removes its lease files. A lease is taken
on a store's first lookup and given up when the store object is released or collected, or the
process ends.
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from pathlib import Path

from filelock import FileLock, Timeout

FOLDER = "leases"


class Lease:
    def __init__(self, lock: FileLock, keys_path: Path):
        self._lock = lock
        self.keys_path = keys_path
        self._keys: set[str] = set()
        self._guard = threading.Lock()
        self._finalizer = weakref.finalize(self, _give_up, lock, keys_path)

    @classmethod
    def take(cls, root: Path) -> "Lease | None":
        """A new lease in the store at ``root``; None where the store cannot hold one (read-only:
        nobody can clean it up either)."""
        folder = Path(root) / FOLDER
        name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        # the lock may be taken by a thread other than the one giving it up
        lock = FileLock(str(folder / f"{name}.lock"), timeout=0, thread_local=False)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            (folder / f"{name}.keys").touch()  # after the lock: a lease file without a held lock is stale
        except (OSError, Timeout):
            if lock.is_locked:
                lock.release()
            return None
        return cls(lock, folder / f"{name}.keys")

    def add(self, key: str) -> None:
        """Hold ``key`` (written through before the caller looks the entry up)."""
        with self._guard:
            if key in self._keys:
                return
            try:
                with open(self.keys_path, "a") as handle:
                    handle.write(key + "\n")
            except OSError:
                return  # a store that turned read-only: no housekeeping can run on it either
            self._keys.add(key)

    def release(self) -> None:
        self._finalizer()


def _give_up(lock: FileLock, keys_path: Path) -> None:
    try:
        keys_path.unlink()
    except OSError:
        pass
    if lock.is_locked:
        lock.release(force=True)
    try:
        Path(lock.lock_file).unlink()
    except OSError:
        pass


def _live(lock_path: Path) -> bool:
    """Whether a running process holds this lease's lock; a stale lease's files are removed."""
    probe = FileLock(str(lock_path), timeout=0)
    try:
        probe.acquire()
    except Timeout:
        return True
    except OSError:
        return True  # cannot tell (a read-only store): count it as held
    try:
        lock_path.with_suffix(".keys").unlink(missing_ok=True)
    except OSError:
        pass
    finally:
        probe.release()
        try:
            lock_path.unlink(missing_ok=True)
        except OSError:
            pass
    return False


def held_keys(root: Path) -> set[str]:
    """Every key a live lease in the store at ``root`` holds."""
    held: set[str] = set()
    for lock_path in sorted((Path(root) / FOLDER).glob("*.lock")):
        if _live(lock_path):
            try:
                held.update(lock_path.with_suffix(".keys").read_text().split())
            except OSError:
                pass  # taken this instant: it has looked nothing up yet
    return held


def remove_stale(root: Path, problems) -> None:
    """Remove the files of leases whose process ended (``clear``); live ones stay."""
    for lock_path in sorted((Path(root) / FOLDER).glob("*.lock")):
        _live(lock_path)
    for keys_path in sorted((Path(root) / FOLDER).glob("*.keys")):
        if not keys_path.with_suffix(".lock").exists():
            problems.unlink(keys_path)
