"""Remember file digests by (inode, size, mtime_ns, ctime_ns) so unchanged large files are not re-hashed.

The same idea as DVC's state and Bazel's digest cache: stat is cheap, sha256 of a
gigabyte is not.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from pathlib import Path

_CHUNK = 1 << 20
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
        conn = sqlite3.connect(_db_path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS state (path TEXT PRIMARY KEY, inode INTEGER, size INTEGER,"
            " mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT)"
        )
        _local.conn = conn
    return conn


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of ``path``, from the state DB when the file's stat is unchanged."""
    path = Path(path).resolve()
    st = os.stat(path)
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    conn = _connection()
    if conn is not None:
        row = conn.execute(
            "SELECT inode, size, mtime_ns, ctime_ns, sha256 FROM state WHERE path = ?", (str(path),)
        ).fetchone()
        if row is not None and tuple(row[:4]) == stamp:
            return row[4]
    digest = sha256_of(path)
    if conn is not None:
        conn.execute("INSERT OR REPLACE INTO state VALUES (?, ?, ?, ?, ?, ?)", (str(path), *stamp, digest))
    return digest


def known_sha256(path: Path) -> str | None:
    """The remembered digest of ``path`` if its stat is unchanged, else None (no hashing)."""
    conn = _connection()
    if conn is None:
        return None
    path = Path(path).resolve()
    st = os.stat(path)
    row = conn.execute(
        "SELECT inode, size, mtime_ns, ctime_ns, sha256 FROM state WHERE path = ?", (str(path),)
    ).fetchone()
    if row is not None and tuple(row[:4]) == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
        return row[4]
    return None
