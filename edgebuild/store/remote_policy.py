"""How a build uses its remote cache: pull on a local miss, push after a build, and a remote that
fails (unreachable, denied, throttled, missing bucket) is dropped for the rest of the run with
one warning — the build goes on locally — unless the remote is required.

A failed write stops pushing only (the remote may still serve pulls); a failed read stops both.
A corrupt remote entry is reported each time it is met, never installed, and replaced by the
next push of its key. The functions take a key and nothing else of the executor, so any
executor (threads, a cluster's workers) can call them.
"""

from __future__ import annotations

import threading
from typing import Callable

from edgebuild.store.remote import RemoteCorrupt, RemoteError, RemoteStore


class RemoteCache:
    def __init__(self, remote: RemoteStore, *, required: bool = False, warn: Callable[[str], None] = lambda _: None):
        self.remote = remote
        self.required = required
        self.warn = warn
        self.reads = True
        self.writes = not remote.settings.read_only  # http(s) is read-only by design: no warning for it
        self.corrupt: set[str] = set()  # keys whose remote entry a push must replace
        self.problems: list[str] = []  # every warning given, for --json reports and tests
        self._warned = False
        self._lock = threading.Lock()

    def pull(self, key: str, layout=None) -> bool:
        """Install ``key``'s remote entry locally; False on a miss, a corrupt entry or a remote error.
        ``layout``: the files the key's stage produces (edgebuild.store.layout)."""
        if not self.reads:
            return False
        try:
            return self.remote.pull(key, layout)
        except RemoteCorrupt as exc:
            with self._lock:
                self.corrupt.add(key)
            self._say(str(exc))
            return False
        except RemoteError as exc:
            self._failed(exc, reading=True)
            return False

    def push(self, key: str) -> bool:
        """Upload ``key``'s local entry unless the remote has it whole; False if nothing was sent."""
        if not self.writes:
            return False
        try:
            return self.remote.push(key, replace=key in self.corrupt)
        except RemoteError as exc:
            self._failed(exc, reading=False)
            return False

    def _failed(self, exc: RemoteError, *, reading: bool) -> None:
        if self.required:
            raise RemoteError(f"{exc.message} (the remote is required: --remote-required or cache.remote_required)",
                              kind=exc.kind, hint=exc.hint)
        with self._lock:
            self.writes = False
            if reading:
                self.reads = False
            first, self._warned = not self._warned, True
        if first:
            self._say(f"{exc}\n  building locally without the remote for the rest of this run"
                      if reading else f"{exc}\n  nothing more is pushed in this run; the build goes on locally")

    def _say(self, message: str) -> None:
        with self._lock:
            self.problems.append(message)
        self.warn(message)


def open_remote(store, settings, *, warn: Callable[[str], None]) -> RemoteCache | None:
    """The run's remote cache for ``settings`` (None: no remote). Nothing is contacted yet."""
    if settings is None or store is None:
        return None
    return RemoteCache(RemoteStore(settings, store), required=settings.required, warn=warn)
