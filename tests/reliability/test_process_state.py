"""A build run in a caller's process (the Python API, a test, a notebook) leaves that process as it
found it: a debugger's or coverage's trace function still runs afterwards. Clearing a pending
async exception used to leave CPython's eval loop flagged for good, and the first traced line
after a build never finished."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from .test_arguments import RECIPE, write_model

TRACED = textwrap.dedent("""
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

AFTER_BUILD = textwrap.dedent("""
    import sys
    from edgebuild.cli.app import main

    sys.argv = ["edgebuild", "run", "recipe.yaml", "-q"]
    try:
        main()
    except SystemExit as done:
        assert done.code == 0, done.code
""") + TRACED

AFTER_CTRL_C = textwrap.dedent("""
    import sys, threading
    from edgebuild.dag.interrupt import Interrupts

    interrupts, me = Interrupts(), threading.get_ident()
    interrupts.request()  # Ctrl-C was pressed while this thread ran a stage body
    interrupts._inside[me] = 1
    interrupts._leave(me)  # the body ends: whatever is pending for it is dropped
""") + TRACED


def traced_events(script: str, cwd, env=None) -> int:
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    word, count = done.stdout.strip().splitlines()[-1].split()
    assert word == "traced"
    return int(count)


def test_a_trace_function_runs_after_an_in_process_build(tmp_path):
    write_model(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    env = {**os.environ, "EDGEBUILD_CACHE_DIR": str(tmp_path / "cache")}
    assert traced_events(AFTER_BUILD, tmp_path, env) >= 3  # call, line(s), return of traced()


def test_a_trace_function_runs_after_a_pending_interrupt_was_dropped(tmp_path):
    assert traced_events(AFTER_CTRL_C, tmp_path) >= 3
