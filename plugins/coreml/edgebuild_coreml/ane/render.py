"""Print a compute plan the way ``edgebuild plan`` does (edgebuild.report.compute_plan renders its data)."""

from __future__ import annotations

from edgebuild_coreml.ane.plan import Plan


def render_plan(plan: Plan, console, *, ops: bool = False) -> None:
    """Write ``plan`` to a ``rich.console.Console``: share of ops and time per unit, ops grouped
    by type and reason, and with ``ops`` one row per op."""
    from edgebuild.report.compute_plan import render

    data = plan.to_json()
    data["policy"] = plan.policy
    render(data, console, ops=ops)
