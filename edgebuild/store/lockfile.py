"""Reading ``edgebuild.lock.json`` (written by :mod:`edgebuild.build.lockfile`): its stage keys, checked."""

from __future__ import annotations

import json
from pathlib import Path

LOCK_NAME = "edgebuild.lock.json"


def read_lock(output_dir: Path) -> dict | None:
    try:
        return json.loads((output_dir / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return None


def lock_keys(path: Path, *, skip=("resolve",)) -> list[str]:
    """The stage keys a lock file names (but ``skip``'s stages), each checked to be a stage key:
    a lock file comes from another job or machine, and a key becomes a store path. UsageError
    naming the file and the stage for anything else."""
    from edgebuild.errors import UsageError
    from edgebuild.store.local import KEY_SHAPE, is_key, shown_value

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read this lock file ({exc})",
                         hint=f"give an {LOCK_NAME} that edgebuild wrote") from None
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, dict):
        raise UsageError(f"{path}: not a lock file (no \"stages\" table)", hint=f"give an {LOCK_NAME} that edgebuild wrote")
    keys = []
    for name, stage in stages.items():
        if name in skip:
            continue
        key = stage.get("key") if isinstance(stage, dict) else None
        if not is_key(key):
            raise UsageError(f"{path}: stages.{shown_value(name, 40)}.key {shown_value(key)} is not a stage key; "
                             "nothing was pulled", hint=f"{KEY_SHAPE}; a lock file edited by hand or by someone else "
                                                        "is not to be trusted")
        keys.append(key)
    return keys
