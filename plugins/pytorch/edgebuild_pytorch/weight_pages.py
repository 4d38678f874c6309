"""Memory-mapped weights that do not stay resident once read.

A state_dict read from safetensors (or ``torch.load(mmap=True)``) is a private mapping of the file:
its pages cost nothing until read, but every page read stays in the process's resident set until the
mapping goes. The PyTorch route reads every weight twice (the eager call that names the outputs, the
export that writes them), so a billion-parameter model would end each pass with all of its fp32 bytes
resident. ``madvise(MADV_DONTNEED)`` drops a range of such a mapping; a later read faults the file's
bytes back in, so only parameters, which inference never writes, are dropped, and only where
``/proc/self/maps`` shows a mapping of a file (anonymous memory would read back as zeros).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from edgebuild.plugin.pages import drop_resident_ranges


def drop_resident_pages(tensors: Iterable) -> int:
    """Drop the resident pages of those ``tensors`` that live in a file mapping; returns the bytes
    advised (edgebuild.mapped_pages)."""
    return drop_resident_ranges((t.data_ptr(), t.numel() * t.element_size()) for t in tensors)


@contextlib.contextmanager
def pages_dropped_after_use(module) -> Iterator[None]:
    """While inside, each submodule's own parameters are dropped after its forward ran, so an
    eager call over a mapped model keeps about one layer of weights resident. TorchScript
    modules take no Python hooks (their calls never come back to Python): theirs are dropped on
    leaving."""
    from torch.jit import ScriptModule

    def after_forward(submodule, _inputs, _output):
        drop_resident_pages(submodule.parameters(recurse=False))

    handles = [sub.register_forward_hook(after_forward) for sub in module.modules()
               if not isinstance(sub, ScriptModule)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        drop_resident_pages(module.parameters())
