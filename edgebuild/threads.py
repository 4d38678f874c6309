"""How many threads a stage's numeric work may use."""

from __future__ import annotations

import contextlib
import os

#: how many validation samples run at once; set, it also starts the runtimes' worker processes at once
WORKERS_ENV = "EDGEBUILD_VALIDATE_WORKERS"


def cpu_threads() -> int:
    """Threads a stage's numeric work may use: ``$OMP_NUM_THREADS`` when set (a scheduler that
    runs one stage per core sets it, as a Dask worker does, and a user capping edgebuild does too),
    else the machine's cores. Pools sized by the machine in each of two single-core workers
    would only take turns on the cores."""
    configured = os.environ.get("OMP_NUM_THREADS", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return os.cpu_count() or 1


def blas_threads(limit: int):
    """A context manager (and an object whose life holds it) capping BLAS pools at ``limit``
    threads, through threadpoolctl where installed: numeric work that runs in several threads or
    processes at once gives each one BLAS thread, or the pools take turns on the cores."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=limit, user_api="blas")


def requested_sample_workers() -> int | None:
    """``$EDGEBUILD_VALIDATE_WORKERS`` as a number, None when unset; a usage error when not a number."""
    configured = os.environ.get(WORKERS_ENV, "").strip()
    if not configured:
        return None
    try:
        return int(configured)
    except ValueError:
        from edgebuild.errors import UsageError

        raise UsageError(f"{WORKERS_ENV}={configured!r} is not a number of workers",
                         hint="set it to 1 to run validation samples one at a time") from None
