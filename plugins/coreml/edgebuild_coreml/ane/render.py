"""Print a compute plan as a rich table, with the per-unit breakdown and the prediction note."""

from __future__ import annotations

from rich.table import Table

from edgebuild_coreml.ane.plan import NOTE, Plan

_UNIT_STYLE = {"ane": "green", "gpu": "cyan", "cpu": "yellow"}


def render_plan(plan: Plan, console) -> None:
    """Write ``plan`` to a ``rich.console.Console``: one row per op, then breakdown and total."""
    table = Table(title=f"Compute plan ({plan.chip}, policy {plan.policy})")
    table.add_column("op")
    table.add_column("type")
    table.add_column("unit")
    table.add_column("est ms", justify="right")
    table.add_column("fused into")
    table.add_column("why not ANE / note")
    for op in plan.ops:
        style = _UNIT_STYLE.get(op.unit, "")
        why = "; ".join(r.message for r in op.reasons)
        table.add_row(
            op.name,
            op.op,
            f"[{style}]{op.unit}[/{style}]" if style else op.unit,
            "" if op.fused_into else f"{op.est_ms:.4f}",
            op.fused_into or "",
            why,
        )
    console.print(table)
    shares = ", ".join(f"{unit} {pct:.1f}%" for unit, pct in plan.breakdown().items())
    console.print(f"breakdown: {shares}    total: {plan.total_ms:.3f} ms")
    console.print(f"[dim]{NOTE}[/dim]")
