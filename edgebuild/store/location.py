"""Where the local store lives: ``--cache-dir``, else ``EDGEBUILD_CACHE_DIR``, else the user cache dir."""

from __future__ import annotations

import os
from pathlib import Path

from edgebuild.errors import UsageError
from edgebuild.store import hashstate
from edgebuild.store.local import Store, shown_value

HINT = "give a directory with --cache-dir or EDGEBUILD_CACHE_DIR"
NAME_MAX = 255  # bytes in one file name: Linux, macOS (APFS) and Windows alike


def _named(cache_dir) -> str:
    return "--cache-dir" if cache_dir else "EDGEBUILD_CACHE_DIR"


def cache_root(cache_dir: str | Path | None) -> Path:
    given = cache_dir or os.environ.get("EDGEBUILD_CACHE_DIR")
    if given:
        if "\0" in str(given):
            raise UsageError(f"{_named(cache_dir)} {shown_value(str(given))}: a path cannot hold a NUL byte", hint=HINT)
        if any(len(os.fsencode(part)) > NAME_MAX for part in Path(given).parts):
            raise UsageError(f"{_named(cache_dir)} {shown_value(str(given))}: a name in it is longer than file "
                             f"systems allow ({NAME_MAX} bytes)", hint=HINT)
        try:
            return Path(given).expanduser().resolve()
        except (OSError, RuntimeError) as exc:
            raise UsageError(f"{_named(cache_dir)} {shown_value(str(given))}: {exc}", hint=HINT) from None
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgebuild"))


def open_store(cache_dir=None, *, create: bool = True) -> Store:
    """The store at ``cache_dir`` (see the module docstring); ``create=False`` (commands that only
    read or clean up): a store that does not exist is empty, and nothing is made for it."""
    root = cache_root(cache_dir)
    try:
        if root.exists() and not root.is_dir():
            raise UsageError(f"{_named(cache_dir)} {root}: is a file, not a directory", hint=HINT)
        if create:
            root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{_named(cache_dir)} {shown_value(str(root))}: cannot be used ({exc.strerror or exc})",
                         hint=HINT) from None
    hashstate.configure(root / "state.db" if create or root.is_dir() else None)
    return Store(root)
