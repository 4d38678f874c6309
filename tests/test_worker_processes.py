"""Worker processes started by edgebuild never run the caller's script again, whatever start
method the script chose: a script without ``if __name__ == "__main__":`` runs its top level once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """\
import multiprocessing, pathlib, sys
from edgebuild.worker_processes import worker_context

method, which = sys.argv[1], sys.argv[2]
if method != "default":
    multiprocessing.set_start_method(method)
with open("top-level.txt", "a") as f:  # once per run of this file's top level
    f.write("ran\\n")
if which == "edgebuild" or __name__ == "__main__":  # the control's child would fail starting one of its own
    ctx = worker_context(preload=["pathlib"]) if which == "edgebuild" else multiprocessing.get_context("forkserver")
    child = ctx.Process(target=pathlib.Path("child-ran").touch)  # relative: the child keeps the working directory
    child.start()
    child.join(60)
    print(child.exitcode)
"""


def _run(tmp_path: Path, method: str, which: str) -> tuple[subprocess.CompletedProcess, int]:
    work = tmp_path / f"{method}-{which}"
    work.mkdir()
    (work / "script.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "script.py", method, which], cwd=work, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert (work / "child-ran").is_file(), done.stderr
    return done, len((work / "top-level.txt").read_text().splitlines())


@pytest.mark.parametrize("method", ["default", "spawn", "forkserver"])
def test_a_worker_does_not_run_the_callers_script(tmp_path, method):
    done, runs = _run(tmp_path, method, "edgebuild")
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
    assert runs == 1


def test_a_plain_forkserver_worker_does_run_it(tmp_path):
    """What the context above prevents: multiprocessing's own forkserver child imports the
    caller's script as ``__mp_main__``, its top level included."""
    done, runs = _run(tmp_path, "default", "multiprocessing")
    assert done.returncode == 0, done.stderr
    assert runs == 2


def _report_whether_it_may_start_workers(connection) -> None:
    from edgebuild.worker_processes import can_start_workers

    connection.send(can_start_workers())


def test_a_daemonic_process_is_told_it_may_start_no_workers():
    """A Dask worker is daemonic: multiprocessing refuses to start its children, so the
    interpreter runs its samples in the worker itself."""
    import multiprocessing

    from edgebuild.worker_processes import can_start_workers, worker_context

    assert can_start_workers()
    ctx = worker_context()
    here, there = ctx.Pipe()
    daemon = ctx.Process(target=_report_whether_it_may_start_workers, args=(there,), daemon=True)
    daemon.start()
    assert here.poll(60) and here.recv() is False
    daemon.join(60)
    assert daemon.exitcode == 0 and not multiprocessing.active_children()
