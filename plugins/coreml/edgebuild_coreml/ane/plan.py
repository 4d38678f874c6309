"""Predict which compute unit (ANE, GPU, CPU) runs each op of a MIL program.

Core ML decides placement itself when the model loads; this module makes the same kind of choice
from published chip figures so a user can see, before shipping, what will likely leave the ANE and
why. Per op: the units the policy allows and the rules permit, a roofline time on each, and a
penalty for every tensor that crosses between units. A Viterbi pass along the program order picks
units, then a few local passes account for the edges that skip ahead (residuals, shared inputs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Mapping

from edgebuild.plugin.recipe import Compute, ComputePolicy

from edgebuild_coreml.ane import cost as cost_model
from edgebuild_coreml.ane import mil_view
from edgebuild_coreml.ane.chips import ChipProfile, get_chip
from edgebuild_coreml.ane.fusion import fused_groups
from edgebuild_coreml.ane.rules import Reason, constant_op_types, eligibility, gpu_eligibility
from edgebuild_coreml.compute import PLACEMENTS

NOTE = "Core ML decides placement when the model loads; this is a prediction."

# Views of compute.PLACEMENTS, the one table of what each policy means here.
STRICT_POLICIES = {policy: placement.strict for policy, placement in PLACEMENTS.items() if placement.strict}
RECIPE_DEFAULT = Compute()  # plan_program's defaults are the recipe's
_REFINE_PASSES = 3


@dataclass
class OpPlan:
    name: str
    op: str
    unit: str
    est_ms: float
    fused_into: str | None
    reasons: list[Reason]
    ane_reasons: list[Reason] = field(default_factory=list, repr=False)
    gpu_reasons: list[Reason] = field(default_factory=list, repr=False)  # see reasons_against
    allowed: tuple[str, ...] = field(default=(), repr=False)  # units the policy, rules and overrides left it
    # estimated ms of its node on each allowed unit, transfers to and from its neighbours included
    unit_ms: dict[str, float] = field(default_factory=dict, repr=False)

    # Under a policy without the GPU its rules do not decide the plan: they are evaluated only when
    # asked for (why the op is not on the GPU, say), not for every op of every plan. Asked after
    # the program changed (a per-shape plan's retyping is undone), they describe the program now.
    unasked_gpu_reasons: Callable[[], list[Reason]] | None = field(default=None, repr=False, compare=False)

    def reasons_against(self, unit: str) -> list[Reason]:
        """The rules' reasons about this op on ``unit`` (``ane`` or ``gpu``)."""
        if unit != "gpu":
            return self.ane_reasons
        if self.unasked_gpu_reasons is not None:
            self.gpu_reasons, self.unasked_gpu_reasons = self.unasked_gpu_reasons(), None
        return self.gpu_reasons

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "op": self.op,
            "unit": self.unit,
            "est_ms": round(self.est_ms, 6),
            "fused_into": self.fused_into,
            "reasons": [r.to_json() for r in self.reasons],
        }


@dataclass
class Plan:
    ops: list[OpPlan]
    chip: str
    policy: str

    @property
    def total_ms(self) -> float:
        return sum(op.est_ms for op in self.ops)

    def breakdown(self) -> dict[str, float]:
        """Share of the estimated time spent on each unit, in percent."""
        total = self.total_ms or 1.0
        return {
            unit: round(100.0 * sum(op.est_ms for op in self.ops if op.unit == unit) / total, 1)
            for unit in ("ane", "gpu", "cpu")
        }

    def unit_of(self, name: str) -> str:
        return next(op.unit for op in self.ops if op.name == name)

    def range_fallback(self) -> list[str]:
        """Names of the ops a range-flexible input keeps off the Neural Engine (its shapes reach them)."""
        return [op.name for op in self.ops if any(r.rule == "dynamic_shape" for r in op.ane_reasons)]

    def to_json(self) -> dict:
        data = {
            "ops": [op.to_json() for op in self.ops],
            "breakdown": self.breakdown(),
            "total_ms": round(self.total_ms, 6),
            "chip": self.chip,
            "note": NOTE,
        }
        fallback = self.range_fallback()
        if fallback:
            data["range_fallback"] = fallback
        return data

    def violations(self, policy: ComputePolicy | None = None) -> list[dict]:
        """For ``ane_only`` / ``gpu_only``: every op the plan places off that unit, with why and a fix.

        Placement, not eligibility: an op the rules allow on the unit but the cost model puts on
        the CPU breaks the promise as much as one the unit cannot run.
        """
        unit = PLACEMENTS[policy or self.policy].strict
        if unit is None:
            return []
        return [
            {"name": op.name, "op": op.op, "unit": unit, "placed": op.unit,
             "reasons": [r.to_json() for r in self.why_not(op, unit)]}
            for op in self.ops if op.unit != unit
        ]

    def why_not(self, op: OpPlan, unit: str) -> list[Reason]:
        """Why ``op`` is not on ``unit``: the rules that forbid it there, else why the plan chose otherwise."""
        blocking = [r for r in op.reasons_against(unit) if r.blocking]
        if blocking:
            return blocking
        name, there, placed = f"{op.op} '{op.name}'", unit.upper(), op.unit.upper()
        if op.fused_into:
            host = next((o for o in self.ops if o.name == op.fused_into), None)
            reasons = self.why_not(host, unit) if host is not None else []
            return [Reason(rule="fused", message=f"{name} is fused into '{op.fused_into}', which runs on the {placed}",
                           fix=reasons[0].fix if reasons else "see that op", source="plan", severity="placement",
                           unit=unit)]
        if unit not in op.allowed:
            return [Reason(rule="excluded", message=f"{name}: compute.policy {self.policy} or compute.overrides "
                           f"keep it off the {there}", fix="remove the override or change compute.policy",
                           source="recipe compute section", severity="placement", unit=unit)]
        return [Reason(
            rule="placement",
            message=f"{name} is cheaper on the {placed}: est. {op.unit_ms.get(op.unit, 0.0):.4f} ms there against "
                    f"{op.unit_ms.get(unit, 0.0):.4f} ms on the {there}, transfers between units included",
            fix=f"small ops, or ops between others that leave the {there}, rarely pay for the trip: make the "
                f"neighbouring ops {there}-eligible" + (
                    f", or choose a policy with a fallback (e.g. {'cpu_and_ne' if unit == 'ane' else 'cpu_and_gpu'})"
                    if self.policy in STRICT_POLICIES else ""),
            source="edgebuild cost model", severity="placement", unit=unit)]


# --- inputs -----------------------------------------------------------------------------------


def dynamic_symbol_map(function, shapes_dynamic: set[str] | None) -> dict:
    """Shape symbols of range-flexible inputs -> input name.

    ``shapes_dynamic=None`` treats every input with a symbolic dimension as range-flexible (the
    cautious reading); pass the names of the range inputs to leave enumerated ones out.
    """
    mapping: dict = {}
    for name, var in function.inputs.items():
        if shapes_dynamic is not None and name not in shapes_dynamic:
            continue
        for symbol in mil_view.symbols_in(var):
            mapping[symbol] = name
    if not mapping:
        return mapping
    # A program read back from its package gives each op's output fresh symbols: an output
    # symbol of an op that reads a range-flexible shape is range-flexible too.
    for op in function.operations:
        sources = sorted({mapping[s] for v in mil_view.data_inputs(op) for s in mil_view.symbols_in(v) if s in mapping})
        if not sources:
            continue
        for out in mil_view.tensor_outputs(op):
            for symbol in mil_view.symbols_in(out):
                mapping.setdefault(symbol, ", ".join(sources))
    return mapping


@dataclass
class _Override:
    unit: str
    op_type: str | None
    name: re.Pattern | None

    def matches(self, op) -> bool:
        if self.op_type is not None and op.op_type != self.op_type:
            return False
        return self.name is None or bool(self.name.fullmatch(op.name))


def _parse_overrides(overrides) -> list[_Override]:
    """compute.overrides (typed, or their JSON dump): the recipe model checked each unit and
    regular expression at load, so they are only compiled here."""
    parsed = []
    for entry in overrides:
        entry = entry if isinstance(entry, Mapping) else entry.model_dump()
        match = entry["match"]
        pattern = re.compile(match["name"]) if match.get("name") else None
        parsed.append(_Override(unit=entry["unit"], op_type=match.get("op_type"), name=pattern))
    return parsed


# --- per-node facts ---------------------------------------------------------------------------


@dataclass
class _Node:
    """A host op plus the ops fused into it: the unit of placement."""

    host: object
    members: list
    allowed: tuple[str, ...]
    time_ms: dict[str, float]
    notes: list[Reason]


def _compute_dtype(op) -> str:
    dtypes = {mil_view.dtype_name(v) for v in mil_view.tensor_outputs(op)}
    return "fp32" if "fp32" in dtypes else "fp16"


def _has_int8(op) -> bool:
    return any(
        mil_view.dtype_name(v) in ("int8", "uint8")
        for v in mil_view.data_inputs(op) + mil_view.tensor_outputs(op)
    )


def _node_times(members, chip: ChipProfile, ane_factor: float) -> dict[str, float]:
    host = members[0]
    costs = [cost_model.op_cost(op) for op in members]
    fused = cost_model.OpCost(flops=sum(c.flops for c in costs), bytes=costs[0].bytes, saved=costs[0].saved)
    dtype, int8 = _compute_dtype(host), _has_int8(host)
    times = {unit: cost_model.unit_time_ms(fused, unit, chip, dtype=dtype, int8=int8) for unit in cost_model.UNITS}
    times["ane"] *= ane_factor
    return times


def _override_note(host, override: _Override, why: str) -> Reason:
    return Reason(
        rule="override",
        message=f"override asked for {override.unit} for {host.op_type} '{host.name}', but {why}",
        fix="remove the override or change compute.policy",
        source="recipe compute.overrides",
        severity="hint",
        unit=override.unit,
    )


def _allowed_units(host, policy_units, eligible, overrides) -> tuple[tuple[str, ...], list[Reason]]:
    allowed = tuple(u for u in policy_units if eligible[u])
    override = next((o for o in overrides if o.matches(host)), None)
    if override is None:
        return allowed, []
    if override.unit not in policy_units:
        return allowed, [_override_note(host, override, "the policy excludes that unit")]
    if not eligible[override.unit]:
        return allowed, [_override_note(host, override, "the op cannot run there (see reasons)")]
    return (override.unit,), []


# --- assignment -------------------------------------------------------------------------------


def _producers(nodes, node_of_op) -> list[list[tuple[int, float]]]:
    """For each node: (producer node index, bytes) for every tensor it reads from another node."""
    edges = []
    for index, node in enumerate(nodes):
        incoming = {}
        for op in node.members:
            for var in mil_view.data_inputs(op):
                source = node_of_op.get(var.op.name) if var.op is not None else None
                if source is not None and source != index:
                    incoming[(source, var.name)] = mil_view.nbytes(var)
        edges.append([(src, size) for (src, _), size in incoming.items()])
    return edges


def _incoming_switch_ms(index, unit, assignment, edges, chip) -> float:
    return sum(
        cost_model.switch_cost_ms(size, assignment[src], unit, chip) for src, size in edges[index]
    )


def _viterbi(nodes, edges, chip) -> list[str]:
    """Cheapest units along program order, charging switches between consecutive nodes."""
    best = [{u: (nodes[0].time_ms[u], None) for u in nodes[0].allowed}] if nodes else []
    for index in range(1, len(nodes)):
        adjacent = sum(size for src, size in edges[index] if src == index - 1)
        layer = {}
        for unit in nodes[index].allowed:
            layer[unit] = min(
                (
                    total + cost_model.switch_cost_ms(adjacent, prev, unit, chip) + nodes[index].time_ms[unit],
                    prev,
                )
                for prev, (total, _) in best[-1].items()
            )
        best.append(layer)
    if not best:
        return []
    unit = min(best[-1], key=lambda u: best[-1][u][0])
    assignment = [unit]
    for layer in reversed(best[1:]):
        unit = layer[unit][1]
        assignment.append(unit)
    return assignment[::-1]


def _consumers(nodes, edges) -> list[list[tuple[int, float]]]:
    consumers = [[] for _ in nodes]
    for index, incoming in enumerate(edges):
        for src, size in incoming:
            consumers[src].append((index, size))
    return consumers


def _local_cost(index, unit, nodes, edges, consumers, assignment, chip) -> float:
    """A node's time on ``unit`` plus every switch it would make with its neighbours' units."""
    outgoing = sum(cost_model.switch_cost_ms(size, unit, assignment[dst], chip) for dst, size in consumers[index])
    return nodes[index].time_ms[unit] + _incoming_switch_ms(index, unit, assignment, edges, chip) + outgoing


def _refine(nodes, edges, assignment, chip) -> list[str]:
    """Local passes: move a node if that lowers its own time plus every switch it touches."""
    consumers = _consumers(nodes, edges)
    for _ in range(_REFINE_PASSES):
        changed = False
        for index, node in enumerate(nodes):
            def local_cost(unit):
                return _local_cost(index, unit, nodes, edges, consumers, assignment, chip)

            choice = min(node.allowed, key=local_cost)
            if local_cost(choice) < local_cost(assignment[index]) - 1e-12:
                assignment[index], changed = choice, True
        if not changed:
            break
    return assignment


# --- entry point ------------------------------------------------------------------------------


def plan_program(
    prog,
    *,
    chip: str = RECIPE_DEFAULT.chip,
    policy: ComputePolicy = RECIPE_DEFAULT.policy,
    overrides=(),
    shapes_dynamic: set[str] | None = None,
) -> Plan:
    """Predict a compute unit and time for every op of ``prog``'s main function.

    ``policy`` and ``overrides`` are the recipe's, validated at load; ``chip`` may also come
    from ``edgebuild plan --chip``, so an unknown one is a UsageError (``get_chip``).
    """
    with mil_view.inputs_read_once():  # the program stays as it is while it is planned
        return _plan_program(prog, chip=chip, policy=policy, overrides=overrides, shapes_dynamic=shapes_dynamic)


def _plan_program(prog, *, chip: str, policy: ComputePolicy, overrides, shapes_dynamic: set[str] | None) -> Plan:
    profile = get_chip(chip)
    policy_units = PLACEMENTS[policy].units
    parsed_overrides = _parse_overrides(overrides)
    function = mil_view.main_function(prog)
    dynamic = dynamic_symbol_map(function, shapes_dynamic)

    skip = constant_op_types()
    ops = [op for op in function.operations if op.op_type not in skip]
    fused_into = fused_groups(ops, function.outputs)
    ane_reasons = {op.name: eligibility(op, profile, dynamic_symbols=dynamic) for op in ops}
    # the GPU's rules decide nothing under a policy without it (ANE's still feed range_fallback)
    gpu_decides = "gpu" in policy_units
    gpu_reasons = {op.name: gpu_eligibility(op, profile, dynamic_symbols=dynamic) if gpu_decides else []
                   for op in ops}

    nodes: list[_Node] = []
    node_of_op: dict[str, int] = {}
    for op in ops:
        if op.name in fused_into:
            host_index = node_of_op[fused_into[op.name]]
            nodes[host_index].members.append(op)
            node_of_op[op.name] = host_index
            continue
        node_of_op[op.name] = len(nodes)
        nodes.append(_Node(host=op, members=[op], allowed=(), time_ms={}, notes=[]))

    for node in nodes:
        members_ane = [r for m in node.members for r in ane_reasons[m.name]]
        members_gpu = [r for m in node.members for r in gpu_reasons[m.name]]
        eligible = {
            "ane": not any(r.blocking for r in members_ane),
            "gpu": not any(r.blocking for r in members_gpu),
            "cpu": True,
        }
        allowed, notes = _allowed_units(node.host, policy_units, eligible, parsed_overrides)
        node.allowed = allowed or ("cpu",)
        node.notes = notes
        ane_factor = 1.0
        for reason in members_ane:
            ane_factor *= reason.cost_factor if not reason.blocking else 1.0
        node.time_ms = _node_times(node.members, profile, ane_factor)

    edges = _producers(nodes, node_of_op)
    assignment = _refine(nodes, edges, _viterbi(nodes, edges, profile), profile)

    consumers = _consumers(nodes, edges)
    plans = []
    for index, node in enumerate(nodes):
        unit = assignment[index]
        unit_ms = {u: _local_cost(index, u, nodes, edges, consumers, assignment, profile) for u in node.allowed}
        host_ms = node.time_ms[unit] + _incoming_switch_ms(index, unit, assignment, edges, profile)
        for member in node.members:
            reasons = []
            if "ane" in policy_units:
                reasons += ane_reasons[member.name]
            if "gpu" in policy_units:
                reasons += gpu_reasons[member.name]
            is_host = member is node.host
            plans.append(OpPlan(
                name=member.name,
                op=member.op_type,
                unit=unit,
                est_ms=host_ms if is_host else 0.0,
                fused_into=None if is_host else node.host.name,
                reasons=reasons + (node.notes if is_host else []),
                ane_reasons=ane_reasons[member.name],
                gpu_reasons=gpu_reasons[member.name],
                allowed=node.allowed,
                unit_ms=unit_ms,
                unasked_gpu_reasons=None if gpu_decides else partial(
                    gpu_eligibility, member, profile, dynamic_symbols=dynamic),
            ))
    order = {op.name: i for i, op in enumerate(ops)}
    plans.sort(key=lambda p: order[p.name])
    return Plan(ops=plans, chip=profile.name, policy=policy)
