"""Progress of a running stage: ``report("ops lowered", 12, 40)`` from stage code, core or plugin.

The executor routes the call to the build's display while the stage runs; outside a build the
call does nothing, so stages work without a display and plugins never print.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

STARTED = "started"  # the sub-step the executor reports when a stage begins to build (not served cached)


Reporter = Callable[[str, int, Optional[int]], None]


_reporter: ContextVar[Optional[Reporter]] = ContextVar("edgebuild_progress", default=None)


@dataclass(frozen=True)
class Step:
    """A stage's progress: ``done`` of ``total`` (None: unknown) ``step`` finished."""

    step: str
    done: int
    total: Optional[int] = None


def report(step: str, done: int, total: Optional[int] = None) -> None:
    """Tell the build's display that ``done`` of ``total`` ``step`` are finished (e.g.
    ``report("samples validated", 3, 8)``). Cheap; a no-op outside a build.

    Threads a stage starts itself do not inherit the reporter: report from the stage's thread.
    """
    reporter = _reporter.get()
    if reporter is not None:
        reporter(step, done, total)


@contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """Route ``report`` calls made in this thread (and its context) to ``reporter``; ``STARTED``
    only once (a stage starts once, whichever of its parts says so first)."""
    started = False

    def once(step: str, done: int, total: Optional[int] = None) -> None:
        nonlocal started
        if step == STARTED:
            if started:
                return
            started = True
        reporter(step, done, total)

    token = _reporter.set(once)
    try:
        yield
    finally:
        _reporter.reset(token)


def announced(produce: Callable) -> Callable:
    """``produce`` reporting ``STARTED`` first: the display learns a stage builds rather than
    being served from the store (which it cannot know before the store's lookup)."""
    def run(*args, **kwargs):
        report(STARTED, 0)
        return produce(*args, **kwargs)

    return run
