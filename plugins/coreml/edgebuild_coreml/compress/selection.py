"""Which weights config each op of a program gets: the section's global one, overrides by op type,
overrides by op name (regexes resolved against the program).

Lookups follow coremltools' ``OptimizationConfig`` exactly (op name, then op type, then global;
a const takes the config of the ops it feeds), so our own passes and coremltools' compress the
same weights. An entry may be None: that op is left alone, and the global config does not reach it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from .program import is_weight_op, iter_ops


@dataclass
class WeightSelection:
    """Typed weights configs (``config.PalettizeWeights``, ...) by scope."""

    global_weights: object = None
    by_type: dict[str, object] = field(default_factory=dict)
    by_name: dict[str, object] = field(default_factory=dict)

    def entries(self) -> list:
        return [self.global_weights, *self.by_type.values(), *self.by_name.values()]

    def is_empty(self) -> bool:
        return all(weights is None for weights in self.entries())

    def map(self, fn: Callable[[object], object]) -> WeightSelection:
        """The same scopes with each entry replaced by ``fn(entry)`` (None stays None)."""

        def apply(weights):
            return None if weights is None else fn(weights)

        return WeightSelection(apply(self.global_weights), {k: apply(w) for k, w in self.by_type.items()},
                               {k: apply(w) for k, w in self.by_name.items()})

    def for_op(self, op):
        """The config of a compute op: by its name, then its type, then the global one."""
        if op.name in self.by_name:
            return self.by_name[op.name]
        if op.op_type in self.by_type:
            return self.by_type[op.op_type]
        return self.global_weights

    def for_const(self, op):
        """The config of a ``const`` (or constexpr) op: its own name's, else that of the ops it feeds,
        which must agree (coremltools' ``_get_const_op_config``)."""
        if op.name in self.by_name:
            return self.by_name[op.name]
        if op.op_type in self.by_type:
            raise ValueError("const ops cannot be set by the `set_op_type` function. Please use `set_global`")
        children = [child for output in op.outputs for child in output.child_ops]
        if not children:
            return None  # feeding only the block's outputs: coremltools leaves it alone
        if all(child.op_type.startswith("constexpr_") for child in children):
            return self.for_const(children[0])
        configs = [self.for_op(child) for child in children]
        for child, config in zip(children, configs):
            if config != configs[0]:
                raise ValueError(f"compression config conflict detected between ops {children[0]} and {child}. "
                                 f"{children[0]} has config {configs[0]} while {child} has {config}.")
        return configs[0]


def select_weights(section, program) -> WeightSelection:
    """The section's weights configs by scope; name regexes matched against the program's compute ops."""
    selection = WeightSelection(section.weights)
    compute_ops = [op for op in iter_ops(program) if not is_weight_op(op)]
    for override in section.overrides:
        match = override.match
        if match.name is None:
            selection.by_type[match.op_type] = override.weights
            continue
        pattern = re.compile(match.name)
        for op in compute_ops:
            if pattern.fullmatch(op.name) and match.op_type in (None, op.op_type):
                selection.by_name[op.name] = override.weights
    return selection
