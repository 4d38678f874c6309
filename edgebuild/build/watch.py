"""``edgebuild watch``: build, then build again whenever something the build read changes.

One process keeps its imports (the plugins, coremltools, onnxruntime) warm between builds, so a
rebuild after an edit pays only for the stages the edit reaches. What is watched, by the same
stat signatures the no-op fast path uses (:mod:`edgebuild.build.uptodate`):

- the build's inputs: the recipes and the recipes they extend, a local source model and its
  data files, validation inputs (``local_inputs``); a change rebuilds in this process;
- the code: every import directory and the sources of working copies whose key versions the
  build computed (:func:`edgebuild.versions.watched_paths`). Modules already imported cannot be
  swapped for their new code, and building with the old code would store results under the new
  code's keys, so a change there starts the command afresh in a new process (``restart``).

The inputs are a few files, polled often (``POLL_SECONDS``): the poll is most of the time from an
edit to its result when the edit reruns nothing (a threshold only judges the stored measurements).
The code is hundreds of files and directories, polled less often (``CODE_POLL_SECONDS``), and
checked once more before every rebuild, so no build runs on code that changed meanwhile.

A change is acted on once the files have stopped changing for a poll (an editor writes a file in
several steps). A recipe that fails to load is reported like any error and watched for its fix.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

POLL_SECONDS = 0.05  # the inputs: a few stat calls each time
CODE_POLL_SECONDS = 1.0  # the code: ~500 stat calls (6 ms) each time; a restart costs seconds anyway


def signatures(paths: Iterable) -> dict[str, object]:
    from edgebuild.build.uptodate import _signature

    return {str(p): _signature(str(p)) for p in paths}


def code_paths() -> list[str]:
    """The import directories and working-copy sources whose change needs fresh imports."""
    from edgebuild.build.uptodate import _import_dirs
    from edgebuild.versions import watched_paths

    return [*_import_dirs(), *watched_paths()]


def input_paths(recipes: list[str], builds: list) -> list[Path]:
    """What the builds read from outside the store, and the recipes given (watched even when
    they failed to load, so that their fix is seen)."""
    from edgebuild.build.jobs import local_inputs

    paths = [Path(r).absolute() for r in recipes]
    for build in builds:
        paths += [Path(p).absolute() for p in local_inputs(build)]
    return list(dict.fromkeys(paths))


def restart_command() -> None:
    """Run this command again in a fresh process, in place of this one."""
    from edgebuild.build import uptodate

    argv = uptodate.entry_argv if uptodate.entry_argv is not None else sys.argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "edgebuild", *argv])


def watch(build: Callable[[list], None], recipes: list[str], *, say: Callable[[str], None],
          restart: Callable[[], None] = restart_command, poll: float = POLL_SECONDS,
          code_poll: float = CODE_POLL_SECONDS, rounds: int | None = None) -> None:
    """Call ``build(planned)`` (which appends the builds it planned to ``planned``), then again
    each time an input changes, until interrupted; ``restart()`` when the code changes.
    ``rounds``: stop after that many builds (for tests)."""
    watched: list[Path] = []
    done = 0
    while True:
        # as the build starts: an edit made while it runs is a change it may not have seen
        before = signatures(input_paths(recipes, []) + watched)
        planned: list = []
        build(planned)
        done += 1
        code = signatures(code_paths())  # after the build: it found the working copies its keys name
        watched = list(dict.fromkeys([*watched, *input_paths(recipes, planned)]))  # a failed load keeps the last set
        if rounds is not None and done >= rounds:
            return
        names = set(map(str, watched))
        inputs = {**signatures(watched), **{p: sig for p, sig in before.items() if p in names}}
        say(f"watching {len(watched)} input file(s) and the installed plugins; Ctrl-C stops")
        changed = _next_change(watched, inputs, code, poll=poll, code_poll=code_poll)
        if changed is None:
            say("installed code changed: starting afresh")
            restart()
            return
        say(f"changed: {', '.join(changed)}")


def _next_change(watched: list[Path], inputs: dict, code: dict, *, poll: float, code_poll: float) -> list[str] | None:
    """The names of the inputs that changed, once their writes have settled; None when the code
    changed (checked every ``code_poll`` seconds, and before an input change is acted on)."""
    code_due = time.monotonic() + code_poll
    while True:
        time.sleep(poll)
        if time.monotonic() >= code_due:
            if signatures(code) != code:
                return None
            code_due = time.monotonic() + code_poll
        now = signatures(watched)
        if now == inputs:
            continue
        while True:  # until the writes have settled
            time.sleep(poll)
            settled = signatures(watched)
            if settled == now:
                break
            now = settled
        if signatures(code) != code:  # an update that changed both: the new code builds it
            return None
        return [Path(p).name for p in now if now[p] != inputs.get(p)]
