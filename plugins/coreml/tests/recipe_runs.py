"""Building a test's recipe the way a user does: ``edgebuild run --json`` in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_built(recipe: Path, workdir: Path) -> tuple[dict, dict]:
    """``(record, report)`` of the recipe's one variant, built into ``workdir / "cache"``; the
    build must succeed (stderr is in the assertion)."""
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "run", str(recipe), "--json", "--cache-dir",
                           str(workdir / "cache")], capture_output=True, text=True, cwd=workdir,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=900)
    assert done.stdout.strip(), f"no JSON on stdout (exit {done.returncode}):\n{done.stderr[-3000:]}"
    [record] = json.loads(done.stdout)["variants"]
    assert record["status"] == "built", f"{record.get('error')}\n{done.stderr[-3000:]}"
    out = workdir / "out" / record["variant"]
    return record, json.loads((out / "report.json").read_text())
