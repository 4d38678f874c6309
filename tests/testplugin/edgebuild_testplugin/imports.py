"""What a fresh interpreter imports: for the tests that keep heavy libraries off cheap paths."""

from __future__ import annotations

import ast
import subprocess
import sys


def imported_by(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` are imported once ``code`` has run in a fresh interpreter, sorted."""
    probe = f"import sys\n{code}\nprint(sorted(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])
