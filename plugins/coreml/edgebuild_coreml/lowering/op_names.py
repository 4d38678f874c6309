"""Op names that depend on the program alone, not on what the process built before it.

The MIL builder names an op the caller left unnamed ``<op type>_<n>`` from one counter per op
type, shared by the whole process, and coremltools clears it only at the end of a conversion.
So the package saved for one program depended on what ran earlier in the same process: another
variant, the previous rebuild in ``edgebuild watch``, a Dask worker's last task, a conversion
stopped half way. :func:`names_from_zero` starts the counters afresh for a program about to be
built, so the same program gets the same names, and the same bytes, in any process. (Stages that
build MIL programs never run side by side in one process: they share the executor's
``coremltools`` exclusive group, since the builder's block stack is global too.)
"""

from __future__ import annotations

from coremltools.converters.mil import Builder


def names_from_zero() -> None:
    """Start the builder's op-name counters afresh, before a new program's first op."""
    Builder.name_count.clear()
