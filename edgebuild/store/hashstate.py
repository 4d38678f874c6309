"""Remember file digests by (inode, size, mtime_ns, ctime_ns) so unchanged large files are not re-hashed.

The same idea as DVC's state and Bazel's digest cache: stat is cheap, sha256 of a
gigabyte is not. The DB only saves work: when SQLite cannot answer (another process holds a
lock past the timeout, a read-only or damaged file), the file is hashed again, never failed.

What this process remembered is also kept in memory, DB or not: a stage that copied or linked a
file whose digest it knew (or hashed it while doing other work) vouches for the result, and the
scan of its output then reads nothing (a decoder's weights are gigabytes, hashed at ~1.7 GB/s).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_CHUNK = 32 << 20
_MIN_CHUNK = 1 << 20
_SMALL_PIECE = 256 << 10
_SLOW_PIECE_SECONDS = 0.002  # a 256 KB piece read and hashed from the page cache takes about 0.25 ms
_SLOW_PIECES = 4
_LOCK_TIMEOUT = 30.0  # seconds to wait for another process's write before hashing instead
_local = threading.local()
_db_path: Path | None = None
_memo: dict[str, tuple[tuple[int, int, int, int], str]] = {}  # resolved path -> (stamp, sha256)
_memo_lock = threading.Lock()


def configure(db_path: Path | None) -> None:
    """Use ``db_path`` as the state DB (None: hash every time, but for what this process vouched for
    since)."""
    global _db_path
    _db_path = db_path
    _local.__dict__.clear()
    with _memo_lock:
        _memo.clear()


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
    with open(path, "rb", buffering=0) as handle:
        for data in _pieces(handle, os.fstat(handle.fileno()).st_size):
            digest.update(data)
    return digest.hexdigest()


def _pieces(handle, size: int) -> Iterator[memoryview]:
    """The file in pieces of _SMALL_PIECE bytes while they come quickly, then in large ones.

    A small piece is still in the CPU's cache when it is hashed; a large one is read back from
    memory (a page-cached 4.4 GB checkpoint: 1.15 GB/s against 0.77). But every read and update
    gives up the GIL, and beside a busy Python thread (a hash in the background of a stage, or
    builds run side by side) each waits up to 5 ms to get it back; a cold disk is slow to answer
    too. A few pieces that take that long (not one: the machine may just have been busy) switch
    to few large reads: 1/16 of the file, 1 MB at least, 32 MB at most.
    """
    small = memoryview(bytearray(min(_SMALL_PIECE, max(size, 1))))
    slow = 0
    while slow < _SLOW_PIECES:
        started = time.perf_counter()
        read = handle.readinto(small)
        if not read:
            return
        yield small[:read]
        slow += time.perf_counter() - started > _SLOW_PIECE_SECONDS
    large = memoryview(bytearray(max(1, min(_CHUNK, max(_MIN_CHUNK, size // 16), size))))
    while read := handle.readinto(large):
        yield large[:read]


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
    resolved = str(Path(path).resolve())
    with _memo_lock:
        _memo[resolved] = (tuple(stamp), digest)
    _query("INSERT OR REPLACE INTO state VALUES (?, ?, ?, ?, ?, ?)", (resolved, *stamp, digest))


def vouch(path: Path, digest: str) -> None:
    """Record ``digest`` for ``path`` as it is now: for a file this process just made from bytes whose
    digest it knew (a copy, a hard link, a file it hashed itself), so it need not be read again."""
    remember(path, stamp_of(os.stat(path)), digest)


def remembered(path: Path) -> bool:
    """Is the digest of ``path`` as it is now remembered (so asking for it reads nothing)?"""
    try:
        path = Path(path).resolve()
        return _remembered(path, os.stat(path)) is not None
    except OSError:
        return False


def hashed_once(path: Path) -> tuple[str, tuple[int, int, int, int]]:
    """(sha256, stamp) of ``path``: remembered if its stat is unchanged, else hashed and remembered."""
    path = Path(path).resolve()
    st = os.stat(path)
    known = _remembered(path, st)
    if known is not None:
        return known, stamp_of(st)
    digest, stamp = hashed(path)
    remember(path, stamp, digest)
    return digest, stamp


def forget(folder: Path) -> None:
    """Drop what is remembered of the files under ``folder`` (an evicted store entry)."""
    prefix = str(Path(folder).resolve()) + os.sep  # (left behind, a row cannot match: a new file has a new ctime)
    with _memo_lock:
        for stale in [p for p in _memo if p.startswith(prefix)]:
            del _memo[stale]
    _query("DELETE FROM state WHERE substr(path, 1, ?) = ?", (len(prefix), prefix))


def _remembered(path: Path, st: os.stat_result) -> str | None:
    with _memo_lock:
        memo = _memo.get(str(path))
    if memo is not None and memo[0] == stamp_of(st):
        return memo[1]
    rows = _query("SELECT inode, size, mtime_ns, ctime_ns, sha256 FROM state WHERE path = ?", (str(path),))
    return rows[0][4] if rows and tuple(rows[0][:4]) == stamp_of(st) else None


def file_sha256(path: Path) -> str:
    """sha256 of ``path``, from the state DB when the file's stat is unchanged since it was hashed."""
    return hashed_once(path)[0]


def known_sha256(path: Path) -> str | None:
    """The remembered digest of ``path`` if its stat is unchanged, else None (no hashing)."""
    path = Path(path).resolve()
    return _remembered(path, os.stat(path))


def link_vouched(source: Path, target: Path) -> None:
    """Hard-link ``target`` to ``source`` and keep ``source``'s remembered digest for both names (a
    link moves the inode's ctime, which would otherwise make the next look hash it again)."""
    source = Path(source)
    known = known_sha256(source)
    os.link(source, target)
    if known is not None:
        vouch(source, known)
        vouch(target, known)
