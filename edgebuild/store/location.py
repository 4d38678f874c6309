"""Where the local store lives: ``--cache-dir``, else ``EDGEBUILD_CACHE_DIR``, else the user cache dir."""

from __future__ import annotations

import os
from pathlib import Path

from edgebuild.store import hashstate
from edgebuild.store.local import Store


def cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser().resolve()
    if os.environ.get("EDGEBUILD_CACHE_DIR"):
        return Path(os.environ["EDGEBUILD_CACHE_DIR"]).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgebuild"))


def open_store(cache_dir=None) -> Store:
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    hashstate.configure(root / "state.db")
    return Store(root)
