"""Worker processes that do not run the caller's script again.

A child of multiprocessing's spawn or forkserver start methods begins by importing the parent's
``__main__`` once more (``multiprocessing.spawn.prepare``, told to by the ``init_main_from_path`` or
``init_main_from_name`` entry of the preparation data the parent sends), so that a target defined
in the script can be found there. That is why a script must guard its top level with
``if __name__ == "__main__":`` before it starts processes. A library's workers have their targets
in importable modules of their own: re-running the user's script in them is never wanted, and a
script that calls ``edgebuild.build(...)`` unguarded would build again in every worker.

:func:`worker_context` gives a forkserver context (no fork of a parent that runs threads; the
server preloads the modules a worker needs, once) whose processes are sent the preparation data
without those two entries: the worker keeps the parent's ``sys.path``, working directory and
``argv``, and never imports its ``__main__``. Forkserver is there on Linux and macOS alike, whatever
the default start method (spawn on macOS) or the one the caller set.
"""

from __future__ import annotations

import io
import multiprocessing
import os
from multiprocessing import context, forkserver, popen_forkserver, spawn, util

#: the preparation entries that make a child import the parent's main module
MAIN_ENTRIES = ("init_main_from_path", "init_main_from_name")


def preparation_without_main(name: str) -> dict:
    """What ``spawn.get_preparation_data`` gives a child, less the parent's main module."""
    data = spawn.get_preparation_data(name)
    for entry in MAIN_ENTRIES:
        data.pop(entry, None)
    return data


class _PopenWithoutMain(popen_forkserver.Popen):
    def _launch(self, process_obj):
        # The steps of popen_forkserver.Popen._launch; only the preparation data differs.
        buffer = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            context.reduction.dump(preparation_without_main(process_obj._name), buffer)
            context.reduction.dump(process_obj, buffer)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, data_fd = forkserver.connect_to_new_process(self._fds)
        # the child watches a duplicate of the data pipe's write end to learn that this process died
        watched = os.dup(data_fd)
        self.finalizer = util.Finalize(self, util.close_fds, (watched, self.sentinel))
        with open(data_fd, "wb", closefd=True) as pipe:
            pipe.write(buffer.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _ProcessWithoutMain(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _PopenWithoutMain(process_obj)


class _ContextWithoutMain(context.ForkServerContext):
    Process = _ProcessWithoutMain


def can_start_workers() -> bool:
    """Whether this process may start worker processes: a daemonic one may not (multiprocessing
    refuses), and a Dask worker is daemonic unless its cluster says otherwise."""
    return not multiprocessing.current_process().daemon


def worker_context(preload: list[str] | None = None) -> context.BaseContext:
    """A forkserver context whose ``Process`` children never import the caller's ``__main__``;
    ``preload``: modules the server imports before it forks a worker (``set_forkserver_preload``,
    which is one setting per process)."""
    ctx = _ContextWithoutMain()
    if preload is not None:
        ctx.set_forkserver_preload(preload)
    return ctx
