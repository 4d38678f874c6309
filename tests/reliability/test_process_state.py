"""A build run in a caller's process (the Python API, a test, a notebook) leaves that process as it
found it: a debugger's or coverage's trace function still runs afterwards. The interrupt
machinery's clearing of pending async exceptions used to leave CPython's eval loop flagged, and
the first traced line after a build never finished."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from .test_arguments import RECIPE, write_model

SCRIPT = textwrap.dedent("""
    import sys
    from edgebuild.cli.app import main

    sys.argv = ["edgebuild", "run", "recipe.yaml", "-q"]
    try:
        main()
    except SystemExit as done:
        assert done.code == 0, done.code

    events = []

    def trace(frame, event, arg):
        events.append(event)
        return trace

    def traced():
        return sum(range(3))

    sys.settrace(trace)
    traced()
    sys.settrace(None)
    print("traced", len(events))
""")


def test_a_trace_function_runs_after_an_in_process_build(tmp_path):
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1].split()
    assert last[0] == "traced" and int(last[1]) >= 3  # call, line(s), return of traced()
