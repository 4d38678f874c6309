"""Choosing one option per layer: a multiple-choice knapsack over size and additive error.

Each layer has options (bytes, cost); the cost of an allocation is the sum of its options'
costs, the additive proxy for output error. An exact dynamic programme over a size grid
gives, for every total size, the least cost reaching it. Sizes are measured from the
smallest option of each layer and rounded up to grid units, so a solution the programme
calls feasible fits the real byte budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GRID_UNITS = 1 << 14


@dataclass(frozen=True)
class Option:
    bytes: int
    cost: float  # inf: not available for this layer


@dataclass
class Frontier:
    """Least cost for every grid size, with what is needed to read back the choices."""

    base_bytes: int  # sum of each layer's smallest option
    unit: float  # bytes per grid unit
    best_cost: np.ndarray  # [units + 1]: least cost with total extra size <= u units
    best_at: np.ndarray  # [units + 1]: the exact size index achieving best_cost[u]
    choices: np.ndarray  # [layers, units + 1]: option chosen per layer at each exact size
    option_units: list[list[int]]  # grid units of every option of every layer

    def allocation(self, units: int) -> list[int]:
        """Option index per layer of the best solution within ``units`` grid units."""
        at = int(self.best_at[units])
        picked = []
        for layer in range(self.choices.shape[0] - 1, -1, -1):
            option = int(self.choices[layer, at])
            picked.append(option)
            at -= int(self.option_units[layer][option])
        return picked[::-1]


def frontier(layers: Sequence[Sequence[Option]], max_bytes: int | None = None) -> Frontier:
    """The programme over all layers up to ``max_bytes`` (default: every layer's largest option)."""
    smallest = [min(o.bytes for o in options if math.isfinite(o.cost)) for options in layers]
    base = sum(smallest)
    largest = sum(max(o.bytes for o in options if math.isfinite(o.cost)) for options in layers)
    span = (largest if max_bytes is None else min(max_bytes, largest)) - base
    unit = max(span, 1) / GRID_UNITS
    size = GRID_UNITS + 1
    units = [[_units_of(o.bytes - low, unit) if math.isfinite(o.cost) else size for o in options]
             for options, low in zip(layers, smallest)]

    cost = np.full(size, np.inf)
    cost[0] = 0.0
    choices = np.zeros((len(layers), size), dtype=np.int16)
    for index, options in enumerate(layers):
        updated = np.full(size, np.inf)
        for option_index, option in enumerate(options):
            shift = units[index][option_index]
            if shift >= size or not math.isfinite(option.cost):
                continue
            shifted = np.full(size, np.inf)
            shifted[shift:] = cost[: size - shift] + option.cost
            better = shifted < updated
            updated[better] = shifted[better]
            choices[index, better] = option_index
        cost = updated

    # Within a budget the best is the cheapest exact size at or below it; ties go to the smaller.
    best_at = np.zeros(size, dtype=np.int64)
    best_cost = np.empty(size)
    running, running_at = np.inf, 0
    for u in range(size):
        if cost[u] < running:
            running, running_at = cost[u], u
        best_cost[u], best_at[u] = running, running_at
    return Frontier(base, unit, best_cost, best_at, choices, units)


def _units_of(extra_bytes: int, unit: float) -> int:
    return int(math.ceil(extra_bytes / unit - 1e-9)) if extra_bytes > 0 else 0


def least_cost_within(front: Frontier, budget_bytes: float) -> list[int] | None:
    """Allocation of least cost whose total bytes are at most ``budget_bytes`` (None if none fit)."""
    if budget_bytes < front.base_bytes:
        return None
    units = min(int(math.floor((budget_bytes - front.base_bytes) / front.unit + 1e-9)), GRID_UNITS)
    if not math.isfinite(front.best_cost[units]):
        return None
    return front.allocation(units)


def smallest_within(front: Frontier, max_cost: float) -> list[int] | None:
    """Allocation of least size whose total cost is at most ``max_cost`` (None if none is)."""
    meeting = np.flatnonzero(front.best_cost <= max_cost)
    if meeting.size == 0:
        return None
    return front.allocation(int(meeting[0]))


def pareto_points(front: Frontier, count: int = 16) -> list[tuple[float, float]]:
    """Up to ``count`` (bytes, cost) points of the estimated size-vs-cost frontier."""
    changes = np.flatnonzero(np.diff(front.best_cost, prepend=np.inf) < 0)
    if changes.size > count:
        changes = changes[np.linspace(0, changes.size - 1, count).round().astype(int)]
    return [(front.base_bytes + float(u) * front.unit, float(front.best_cost[u])) for u in changes]
