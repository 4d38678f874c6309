"""Ctrl-C that stops a stage wherever its body runs, even inside libraries that swallow it.

Python turns SIGINT into KeyboardInterrupt in the main thread only, and the libraries stage
bodies call do not always let it through: coremltools imports its optional dependencies
(torch, transformers, ...) inside bare ``except:`` clauses, so an interrupt during the
seconds that import takes is dropped and the build goes on to finish. So once Ctrl-C is
pressed, every thread still inside a stage body gets KeyboardInterrupt raised in it again
(CPython's ``PyThreadState_SetAsyncExc``) every ``REPEAT_SECONDS`` until it has left the body.
Nothing is raised outside stage bodies, so the store's cleanup of a half-built entry, which
runs after the body has been left, is never cut short.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from contextlib import contextmanager

REPEAT_SECONDS = 0.1

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
_set_async_exc.restype = ctypes.c_int


def _raise_in(thread_id: int) -> None:
    _set_async_exc(thread_id, id(KeyboardInterrupt))  # id() is the object's address in CPython


class _Drained(BaseException):
    """Put in place of a pending KeyboardInterrupt and caught at once (see ``_clear_pending``)."""


def _clear_pending(thread_id: int) -> None:
    """Drop an interrupt still pending for this thread (``thread_id`` must be the caller's own).
    Not by setting NULL: CPython 3.11 raises its eval loop's async-exception flag on every call and
    lowers it only when it delivers an exception, so a NULL left it raised for good (every later
    bytecode on the slow path; a trace function, pdb's or coverage's, hung). A private exception
    replaces the pending one and is caught here, which lowers the flag."""
    try:
        _set_async_exc(thread_id, id(_Drained))
        for _ in range(1_000_000):  # delivered as the call returns, or at the loop's first jump back
            pass
    except _Drained:
        pass


class Interrupts:
    """Ctrl-C for one executor run: remembered, and delivered into stage bodies until they end."""

    def __init__(self):
        self.requested = threading.Event()
        self._lock = threading.Lock()
        self._inside: dict[int, int] = {}  # thread id -> nesting depth of stage bodies
        self._done = threading.Event()
        self._wake = threading.Event()  # set by Ctrl-C and by the end of the run: the deliverer sleeps until then

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was pressed (before a stage starts, after a run)."""
        if self.requested.is_set():
            raise KeyboardInterrupt

    def request(self) -> None:
        self.requested.set()
        self._wake.set()

    @contextmanager
    def stage_body(self):
        """Run a stage body; once Ctrl-C is pressed it keeps being interrupted until it has left."""
        me = threading.get_ident()
        with self._lock:
            self.check()
            self._inside[me] = self._inside.get(me, 0) + 1
        try:
            yield
        finally:
            self._leave(me)

    def _leave(self, me: int) -> None:
        # An interrupt sent just before we took the lock may surface here; go on until this thread
        # is off the list and has nothing pending, so none is raised after the body has been left.
        while True:
            try:
                with self._lock:
                    depth = self._inside.pop(me, 1) - 1
                    if depth:
                        self._inside[me] = depth
                    elif self.requested.is_set():  # only after Ctrl-C can one be pending
                        _clear_pending(me)
                return
            except KeyboardInterrupt:
                continue

    @contextmanager
    def watching(self):
        """Catch SIGINT (from the main thread) and deliver it into stage bodies for the block's duration."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)

            def on_sigint(signum, frame):
                self.request()
                raise KeyboardInterrupt

            signal.signal(signal.SIGINT, on_sigint)
        deliverer = threading.Thread(target=self._deliver, name="edgebuild-interrupts", daemon=True)
        deliverer.start()
        try:
            yield self
        finally:
            self._done.set()
            self._wake.set()  # the deliverer ends now, not at its next poll
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            deliverer.join()

    def _deliver(self) -> None:
        self._wake.wait()
        while not self._done.is_set():
            # the first KeyboardInterrupt is the signal's own; repeat only for bodies that swallowed it
            if self._done.wait(REPEAT_SECONDS):
                return
            with self._lock:
                for thread_id in self._inside:
                    _raise_in(thread_id)
