"""What MIL may assume about each ``while_loop`` variable while the body is built.

MIL builds a loop body with each variable's initial value and type, then once more with the
values and dims that changed forgotten, and fails if a second build changes anything else. A
variable that looks constant in the first build can change in the second: a condition computed
from carried values that all start as constants stays ``True`` with the initial values, then
becomes unknown once they are forgotten. So the loop's assumptions are settled first, as a
fixpoint over throwaway builds (``LoopState.learn``), and the real build starts from them: a
variable keeps a known value only when every iteration gives it back, and its type is widened to
the dims that change. A body output that is a constant for a variable whose value varies is
hidden behind a run-time zero, as MIL would otherwise read "the value changed" again.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.ops.defs.iOS15.control_flow import while_loop
from coremltools.converters.mil.mil.types.type_mapping import is_subtype
from coremltools.converters.mil.mil.var import Var

COUNTER = 0  # the iteration number is always loop variable 0, and always changes


class LoopState:
    """The variables (by position in ``loop_vars``) whose values vary, and the widened types."""

    def __init__(self, initial: list[Var]):
        self.varying = {COUNTER} | {j for j, v in enumerate(initial) if v.val is None}
        self.widened: dict[int, type] = {}  # position -> tensor type with the changing dims symbolic
        self.settled = len(self.varying) == len(initial)  # nothing known to lose: no probe needed
        self.type_change = False  # some variable changes rank or type: the real build reports it

    def prepare(self, block_inputs) -> None:
        """Make the block's inputs say what the loop may assume (before any op reads them).

        MIL itself forgets a changed value and widens a changed shape this way, through the
        block inputs' private fields; there is no public setter.
        """
        for j, var in enumerate(block_inputs):
            if j in self.widened:
                var._sym_type = self.widened[j]
            if j in self.varying:
                var._sym_val = None

    def learn(self, block_inputs, outputs) -> None:
        """One probe's lesson: which variables' values or dims an iteration changes."""
        changed = False
        for j, (before, after) in enumerate(zip(block_inputs, outputs)):
            if not is_subtype(after.sym_type, before.sym_type):
                shape = while_loop.get_compat_shape(after.sym_type, before.sym_type)
                if shape is None or after.dtype != before.dtype:
                    self.type_change = True
                    continue
                self.widened[j] = types.tensor(before.dtype, shape)
                changed = True
            if j not in self.varying and not _same_value(after.sym_val, before.sym_val):
                self.varying.add(j)
                changed = True
        self.settled = not changed or self.type_change

    def hide_constants(self, ctx, node, block_inputs, outputs) -> list:
        """Outputs for the real build: a constant given for a varying variable becomes a run-time value."""
        zero = None
        hidden = []
        for j, out in enumerate(outputs):
            if j in self.varying and out.val is not None:
                if zero is None:  # the counter is unknown at build time, so counter * 0 is too
                    zero = mb.mul(x=block_inputs[COUNTER], y=np.int32(0), name=ctx.name(node, "run_time_zero"))
                out = _plus_zero(ctx, node, out, zero, j)
            hidden.append(out)
        return hidden


def _same_value(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype.kind == b.dtype.kind and bool(np.array_equal(a, b))


def _plus_zero(ctx, node, value, zero, j):
    name = ctx.name(node, f"v{j}_run_time")
    if value.dtype == types.bool:
        return mb.logical_or(x=value, y=mb.cast(x=zero, dtype="bool"), name=name)
    if value.dtype == types.int32:
        return mb.add(x=value, y=zero, name=name)
    return mb.add(x=value, y=mb.cast(x=zero, dtype=types.builtin_to_string(value.dtype)), name=name)


def like_input(ctx, node, out, before, j):
    """``out`` in the kind of ``before``: MIL tells a scalar from a one-element tensor, and a loop
    variable must keep its type (a counter that starts from a rank-0 graph input is a scalar; the
    body's ``Add`` of a rank-0 constant gives a rank-0 tensor)."""
    if not isinstance(out, Var) or out.dtype != before.dtype:
        return out
    scalar_in, scalar_out = not types.is_tensor(before.sym_type), not types.is_tensor(out.sym_type)
    if scalar_in == scalar_out or not _one_element(before if not scalar_in else out):
        return out
    if not scalar_in:
        return mb.reshape(x=out, shape=np.array(before.shape, np.int32), name=ctx.name(node, f"v{j}_as_input"))
    flat = mb.reshape(x=out, shape=[1], name=ctx.name(node, f"v{j}_1d"))  # a reshape to [] stays a tensor
    return mb.squeeze(x=flat, name=ctx.name(node, f"v{j}_as_input"))


def _one_element(var) -> bool:
    return all(isinstance(d, (int, np.integer)) and d == 1 for d in var.shape)
