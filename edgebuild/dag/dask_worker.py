"""Set-up for a Dask worker that builds edgebuild stages, loaded as it starts:

    dask worker tcp://HOST:PORT --nthreads 1 --preload edgebuild.dag.dask_worker

- Every installed plugin is imported once, before any build (coremltools alone takes seconds
  per process): without it the first stage each worker runs pays that inside the build.
- A worker is one core's worth of work (``--nthreads 1``, as ``make cluster`` starts them):
  the validation sample pool runs on that many threads, not one per core of the machine, and
  so do BLAS and OpenMP (the nanny sets ``OMP_NUM_THREADS=1`` before a worker starts; this also
  covers a worker started without one). Two workers each spreading over both cores of a
  two-core machine only take turns.

Optional: a worker without it builds the same stages, starting more slowly.
"""

from __future__ import annotations

import logging
import os
import time

from edgebuild.dag.validate import WORKERS_ENV


def dask_setup(worker) -> None:
    threads = str(max(1, worker.state.nthreads))
    os.environ.setdefault(WORKERS_ENV, threads)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:  # a BLAS already loaded read its variables at load time
        threadpool_limits(limits=int(threads))
    start = time.perf_counter()
    from edgebuild.registry import get_registry

    get_registry().load_all()
    logging.getLogger(__name__).info("edgebuild plugins imported in %.1f s", time.perf_counter() - start)
