"""A backend's compute plan (``{"ops", "breakdown", "total_ms", ...}``), summarised for people.

A plan lists every op with the unit predicted to run it, its estimated time and the reasons
it cannot use a faster unit. A model has hundreds of ops and one reason often covers most
of them, so ``edgebuild plan`` and the report lead with the share of ops and of time per
unit, then one row per (op type, unit, reasons); the per-op table is there on request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

UNITS = ("ane", "gpu", "cpu")
_UNIT_STYLE = {"ane": "green", "gpu": "cyan", "cpu": "yellow"}


@dataclass
class UnitShare:
    unit: str
    ops: int
    ms: float
    op_share: float  # percent of the ops (fused ops count with the op they are fused into)
    time_share: float  # percent of the estimated time


@dataclass
class OpGroup:
    op: str
    unit: str
    reasons: tuple[str, ...]  # with the op's own name taken out, so one sentence covers every op
    fixes: tuple[str, ...]
    count: int = 0
    ms: float = 0.0
    names: list[str] = field(default_factory=list)


def unit_shares(ops: Sequence[Mapping[str, Any]]) -> list[UnitShare]:
    """Per unit that runs any op: how many ops and how much of the estimated time."""
    total_ms = sum(float(op.get("est_ms") or 0.0) for op in ops) or 1.0
    units = [*UNITS, *sorted({str(op.get("unit")) for op in ops} - set(UNITS))]
    shares = []
    for unit in units:
        mine = [op for op in ops if op.get("unit") == unit]
        if mine:
            ms = sum(float(op.get("est_ms") or 0.0) for op in mine)
            shares.append(UnitShare(unit, len(mine), ms, 100.0 * len(mine) / len(ops), 100.0 * ms / total_ms))
    return shares


def op_groups(ops: Sequence[Mapping[str, Any]]) -> list[OpGroup]:
    """Ops grouped by reasons, unit and type: the groups sharing reasons stay together, the most
    expensive reasons first, and within them the most expensive op type first."""
    groups: dict[tuple, OpGroup] = {}
    for op in ops:
        name, op_type = str(op.get("name", "")), str(op.get("op", op.get("op_type", "")))
        reasons = tuple(_general(str(r.get("message", "")), op_type, name) for r in op.get("reasons") or [])
        fixes = tuple(dict.fromkeys(str(r.get("fix")) for r in op.get("reasons") or [] if r.get("fix")))
        key = (reasons, str(op.get("unit", "")), op_type)
        group = groups.setdefault(key, OpGroup(op_type, key[1], reasons, fixes))
        group.count += 1
        group.ms += float(op.get("est_ms") or 0.0)
        group.names.append(name)
    by_reasons: dict[tuple, float] = {}
    for group in groups.values():
        by_reasons[group.reasons] = by_reasons.get(group.reasons, 0.0) + group.ms
    return sorted(groups.values(), key=lambda g: (-by_reasons[g.reasons], g.reasons, -g.ms, -g.count, g.op))


def _general(message: str, op_type: str, name: str) -> str:
    """``conv 'stem.0' works on fp32`` -> ``works on fp32``: one sentence for every op it covers."""
    if not name:
        return message
    for prefix in (f"{op_type} '{name}' ", f"'{name}' "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message.replace(f" '{name}'", "")


def render(plan: Mapping[str, Any], console, *, title: str = "Compute plan", ops: bool = False) -> None:
    """Write ``plan`` to a rich console: the per-unit summary, the grouped table, and with
    ``ops`` the per-op table; then strict-policy violations and Core ML's measured agreement."""
    from rich.markup import escape
    from rich.table import Table

    all_ops = list(plan.get("ops") or [])
    where = ", ".join(f"{k} {plan[k]}" for k in ("chip", "policy") if plan.get(k))
    heading = f"{title} ({where})" if where else title
    console.print(f"[bold]{escape(heading)}[/]: {len(all_ops)} ops, estimated {float(plan.get('total_ms') or 0.0):.3f} ms")
    summary = Table("unit", "ops", "share of ops", "est ms", "share of time", title="breakdown by unit")
    for share in unit_shares(all_ops):
        summary.add_row(_unit(share.unit), str(share.ops), f"{share.op_share:.1f}%", f"{share.ms:.4f}",
                        f"{share.time_share:.1f}%")
    console.print(summary)
    per_shape = plan.get("per_shape") or []
    if per_shape:
        render_per_shape(per_shape, console)
    preview = plan.get("ane_layout_preview") or {}
    if preview.get("before"):
        console.print(escape(ane_layout_line(preview)))
    fallback = plan.get("range_fallback") or []
    if fallback:  # a backend lists the ops its range-flexible inputs keep off the Neural Engine
        console.print(f"[yellow]range-flexible input shapes keep {len(fallback)} of {len(all_ops)} op(s) off the "
                      "Neural Engine[/]; enumerated shapes ({enumerated: [...]}) or fixed sizes keep them eligible")
    grouped = Table(title="by reason and op type")
    grouped.add_column("why not a faster unit / note", ratio=3, overflow="fold")
    grouped.add_column("fix", ratio=3, overflow="fold")
    for column in ("unit", "op", "ops", "est ms"):
        grouped.add_column(column, justify="right" if column in ("ops", "est ms") else "left", no_wrap=True)
    groups = op_groups(all_ops)
    for index, group in enumerate(groups):
        first = index == 0 or groups[index - 1].reasons != group.reasons
        last = index == len(groups) - 1 or groups[index + 1].reasons != group.reasons
        grouped.add_row(escape("; ".join(group.reasons) or "—") if first else "",
                        escape("; ".join(group.fixes)) if first else "",
                        _unit(group.unit), escape(group.op), str(group.count), f"{group.ms:.4f}", end_section=last)
    console.print(grouped)
    if ops:
        table = Table("op", "type", "unit", "est ms", "fused into", "why not a faster unit / note", title="per op")
        for op in all_ops:
            table.add_row(escape(str(op.get("name", ""))), escape(str(op.get("op", ""))), _unit(str(op.get("unit", ""))),
                          "" if op.get("fused_into") else f"{float(op.get('est_ms') or 0.0):.4f}",
                          escape(str(op.get("fused_into") or "")),
                          escape("; ".join(str(r.get("message", "")) for r in op.get("reasons") or [])))
        console.print(table)
    else:
        console.print("[dim]--ops lists every op[/]")
    violations = plan.get("violations") or []
    if violations:
        names = ", ".join(f"{v['op']} '{v['name']}'" for v in violations)
        console.print(f"[red]{escape(str(plan.get('policy')))}[/]: {len(violations)} op(s) cannot run on the "
                      f"{str(violations[0]['unit']).upper()}: {escape(names)}")
    measured = plan.get("measured") or {}
    if "agreement" in measured:
        console.print(f"Core ML's own plan: {measured['compared']} ops compared, prediction agrees on "
                      f"{measured['agreement']:.0%} ({measured['cost_weighted_agreement']:.0%} by cost)")
    if plan.get("note"):
        console.print(f"[dim]{escape(str(plan['note']))}[/]")


def shape_label(row: Mapping[str, Any]) -> str:
    """``Q=64`` for a query length, ``x[0]=4`` for another varying dim, else the inputs' shapes."""
    if row.get("query_length") is not None:
        return f"Q={row['query_length']}"
    varying = row.get("varying")
    if varying:
        return f"{varying['input']}[{varying['axis']}]={varying['size']}"
    return ", ".join(f"{name} {list(shape)}" for name, shape in (row.get("inputs") or {}).items())


PER_SHAPE_HEADERS = ("shape", "ops", "ANE ops", "ANE share of ops", "ANE est ms", "total est ms", "ANE share of time")


def per_shape_cells(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The per-shape rows of a plan (``plan["per_shape"]``) as text cells under ``PER_SHAPE_HEADERS``."""
    return [[shape_label(row), str(row.get("ops", "")), str(row.get("ane_ops", "")),
             f"{float(row.get('ane_op_share') or 0.0):.1f}%", f"{float(row.get('ane_ms') or 0.0):.4f}",
             f"{float(row.get('total_ms') or 0.0):.4f}", f"{float(row.get('ane_time_share') or 0.0):.1f}%"]
            for row in rows]


def ane_layout_line(preview: Mapping[str, Any]) -> str:
    """What ``compute.rewrites.ane_layout`` would change: the Neural Engine's share before -> after."""
    def change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
        return (f"ANE share of time {float(before['ane_time_share']):.1f}% -> {float(after['ane_time_share']):.1f}%, "
                f"of ops {float(before['ane_op_share']):.1f}% -> {float(after['ane_op_share']):.1f}%, "
                f"est. {float(before['total_ms']):.4f} -> {float(after['total_ms']):.4f} ms")

    parts = [change(preview["before"], preview["after"])]
    parts += [f"{shape_label(row['after'])}: {change(row['before'], row['after'])}" for row in preview.get("per_shape") or []]
    return (f"compute.rewrites.ane_layout would rewrite {preview.get('sites')} site(s): " + "; ".join(parts))


def render_per_shape(rows: Sequence[Mapping[str, Any]], console) -> None:
    """One row per enumerated input shape (per query length for a decoder): the Neural Engine's
    share of the ops and of the estimated time at that shape."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(*PER_SHAPE_HEADERS, title="per enumerated shape (Core ML compiles each on its own)")
    for cells in per_shape_cells(rows):
        table.add_row(*(escape(c) for c in cells))
    console.print(table)


def _unit(unit: str) -> str:
    style = _UNIT_STYLE.get(unit)
    return f"[{style}]{unit}[/]" if style else unit
