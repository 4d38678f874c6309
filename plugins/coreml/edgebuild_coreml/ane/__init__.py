"""Compute-unit policy for Core ML: chip profiles, ANE eligibility rules, cost model and plan.

``plan_program(prog, chip=..., policy=...)`` predicts the unit of every op of a pymil Program;
``eligibility(op, chip)`` explains why an op cannot use the ANE;
``rewrites`` holds ANE-friendly program passes.
"""

from __future__ import annotations

_EXPORTS = {
    "plan_program": "plan",
    "Plan": "plan",
    "eligibility": "rules",
    "gpu_eligibility": "rules",
    "Reason": "rules",
    "get_chip": "chips",
    "load_chips": "chips",
    "apply_rewrites": "rewrites",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Lazy: the plan and rules import coremltools, which is slow to import.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
