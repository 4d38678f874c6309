"""Remember file digests by (inode, size, mtime_ns, ctime_ns) so unchanged large files are not re-hashed.

The same idea as DVC's state and Bazel's digest cache: stat is cheap, sha256 of a
gigabyte is not. The DB only saves work: when SQLite cannot answer (another process holds a
lock past the timeout, a read-only or damaged file), the file is hashed again, never failed.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from pathlib import Path

_CHUNK = 1 << 20
_LOCK_TIMEOUT = 30.0  # seconds to wait for another process's write before hashing instead
_local = threading.local()
_db_path: Path | None = None


def configure(db_path: Path | None) -> None:
    """Use ``db_path`` as the state DB (None: hash every time)."""
    global _db_path
    _db_path = db_path
    _local.__dict__.clear()


def _connection() -> sqlite3.Connection | None:
    if _db_path is None:
        return None
    conn = getattr(_local, "conn", None)
    if conn is None:
        _db_path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(_db_path, timeout=_LOCK_TIMEOUT, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS state (path TEXT PRIMARY KEY, inode INTEGER, size INTEGER,"
            " mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT)"
        )
        _local.conn = conn
    return conn


def _query(sql: str, args: tuple) -> list[tuple]:
    """Rows of ``sql``, or none when there is no DB or SQLite cannot answer now."""
    try:
        conn = _connection()
        return [] if conn is None else conn.execute(sql, args).fetchall()
    except sqlite3.Error:
        return []


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stamp_of(st: os.stat_result) -> tuple[int, int, int, int]:
    """What must stay equal for a remembered digest to hold; ctime is set by the kernel on every
    write, chmod, link or utime, so ``touch`` cannot forge it."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hashed(path: Path) -> tuple[str, tuple[int, int, int, int]]:
    """(sha256, stamp) of ``path``, the stamp taken around the read so that it vouches for the digest."""
    for _ in range(3):
        before = stamp_of(os.stat(path))
        digest = sha256_of(path)
        if stamp_of(os.stat(path)) == before:
            break
    return digest, before  # a file still changing gets a stamp that the next look will not match


def remember(path: Path, stamp: tuple[int, int, int, int], digest: str) -> None:
    """Record that ``path`` had ``digest`` while its stat was ``stamp``."""
    _query("INSERT OR REPLACE INTO state VALUES (?, ?, ?, ?, ?, ?)", (str(Path(path).resolve()), *stamp, digest))


def forget(folder: Path) -> None:
    """Drop what is remembered of the files under ``folder`` (an evicted store entry)."""
    prefix = str(Path(folder).resolve()) + os.sep  # (left behind, a row cannot match: a new file has a new ctime)
    _query("DELETE FROM state WHERE substr(path, 1, ?) = ?", (len(prefix), prefix))


def _remembered(path: Path, st: os.stat_result) -> str | None:
    rows = _query("SELECT inode, size, mtime_ns, ctime_ns, sha256 FROM state WHERE path = ?", (str(path),))
    return rows[0][4] if rows and tuple(rows[0][:4]) == stamp_of(st) else None


def file_sha256(path: Path) -> str:
    """sha256 of ``path``, from the state DB when the file's stat is unchanged since it was hashed."""
    path = Path(path).resolve()
    known = _remembered(path, os.stat(path))
    if known is not None:
        return known
    digest, stamp = hashed(path)
    remember(path, stamp, digest)
    return digest


def known_sha256(path: Path) -> str | None:
    """The remembered digest of ``path`` if its stat is unchanged, else None (no hashing)."""
    path = Path(path).resolve()
    return _remembered(path, os.stat(path))
