"""Errors of kernel declarations, sources and runs (all build errors: exit code 1)."""

from __future__ import annotations

from edgebuild.plugin import BuildError


class KernelError(BuildError):
    """A kernel whose source, signature or run does not match its declaration."""


class UnsupportedConstruct(KernelError):
    """MSL outside the subset the CPU emulation runs (docs/msl.md lists it)."""


class KernelRace(KernelError):
    """ThreadSanitizer saw a data race while the kernel ran (a missing barrier, usually)."""
