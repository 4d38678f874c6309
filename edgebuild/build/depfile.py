"""Make-format dependency files (``--depfile``): each variant's output directory depends on its local inputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from edgebuild.build.jobs import local_inputs
from edgebuild.store.atomic import write_text_atomic

if TYPE_CHECKING:
    from edgebuild.build.jobs import Build


def write_depfile(path: Path, builds: list[Build]) -> str:
    """Make-format dependencies: each variant's output dir depends on its local inputs. Returns the text."""
    lines = []
    for build in builds:
        escape = lambda p: str(os.path.relpath(p)).replace(" ", "\\ ")
        lines.append(f"{escape(build.output_dir)}: " + " \\\n  ".join(escape(p) for p in local_inputs(build)))
    text = "\n".join(lines) + "\n"
    write_text_atomic(path, text)
    return text
