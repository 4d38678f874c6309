"""ONNX Loop onto MIL ``while_loop``; the body is lowered with the converter's ``lower_subgraph``.

Loop variables are ``(iteration, condition?, carried..., scan buffers...)``. ONNX scan outputs
grow by one row per iteration, but a MIL loop variable keeps its rank, so each scan output is
collected into a buffer preallocated with M rows (``scatter`` writes row ``i``). Its row shape
is found by building the loop once without buffers (that probe is then removed). When the
loop may stop early (a runtime condition), the buffers are cut to the rows written. What MIL
may assume about the variables (a value known at build time, a static dim) is settled before
the loop is built (``_loop_state``).
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.var import Var

from edgebuild_coreml.lowering.converter import constant_node_value
from edgebuild_coreml.lowering.ops._loop_rows import check_row_types, pin_declared_shapes, row_buffer, write_row
from edgebuild_coreml.lowering.ops._loop_state import LoopState, like_input
from edgebuild_coreml.lowering.registry import lowers

_INT32_MAX = np.iinfo(np.int32).max


def _trip_count(ctx, node):
    """M as an int32 scalar (constant or Var), or None when absent or "unbounded" (int64 max)."""
    if not ctx.has_input(node, 0):
        return None
    value = ctx.const_value(node.inputs[0])
    if value is not None:
        count = int(np.asarray(value).reshape(-1)[0])
        return None if count > _INT32_MAX else np.int32(max(count, 0))
    trip = ctx.input(node, 0)
    trip = _as_scalar(ctx, node, trip, "m")
    return trip if trip.dtype == types.int32 else mb.cast(x=trip, dtype="int32", name=ctx.name(node, "m_i32"))


def _as_scalar(ctx, node, value, tag):
    """A MIL scalar from a one-element tensor (MIL tells a rank-0 tensor from a scalar, and a
    loop variable must keep its type)."""
    if not types.is_tensor(value.sym_type):
        return value
    flat = mb.reshape(x=value, shape=[1], name=ctx.name(node, tag + "_1d"))
    return mb.squeeze(x=flat, name=ctx.name(node, tag + "_scalar"))


def _scalar_bool(ctx, node, value, tag):
    if not isinstance(value, Var):
        return np.bool_(np.asarray(value).reshape(-1)[0])
    value = _as_scalar(ctx, node, value, tag)
    return value if value.dtype == types.bool else mb.cast(x=value, dtype="bool", name=ctx.name(node, tag + "_bool"))


def _may_stop_early(body, cond) -> bool:
    """False when the condition provably stays true: absent, or constant true and passed through."""
    if cond is None:
        return False  # no condition input: the body's condition output is ignored
    if isinstance(cond, Var) and cond.val is None:
        return True  # decided at run time
    if not bool(np.asarray(getattr(cond, "val", cond))):
        return True
    cond_out = body.outputs[0]
    while cond_out.producer() is not None and cond_out.producer().op_type == "Identity":
        cond_out = cond_out.producer().inputs[0]
    if cond_out is body.inputs[1]:
        return False
    producer = cond_out.producer()
    if producer is not None and producer.op_type == "Constant":
        return not bool(np.asarray(constant_node_value(producer)).all())
    return True


@lowers("Loop", since=1)
def loop(ctx, node):
    body = ctx.attr(node, "body")
    trip = _trip_count(ctx, node)
    cond = _scalar_bool(ctx, node, ctx.input(node, 1), "cond") if ctx.has_input(node, 1) else None
    carried = [ctx.input(node, k) for k in range(2, len(node.inputs))]
    carried = [v if isinstance(v, Var) else mb.const(val=np.asarray(v), name=ctx.name(node, f"v{k}_init"))
               for k, v in enumerate(carried)]
    scans = len(body.outputs) - 1 - len(carried)
    if len(body.inputs) != 2 + len(carried) or scans < 0:
        ctx.fail(node, f"the body takes {len(body.inputs)} inputs and gives {len(body.outputs)} outputs "
                 f"for {len(carried)} loop-carried values")
    if trip is None and cond is None:
        ctx.fail(node, "has neither a trip count nor a condition: it would never end")
    if scans and trip is None:
        ctx.fail(node, "has scan outputs but no trip count: Core ML's while_loop keeps every loop variable's "
                 "rank, so scan outputs are gathered into a buffer preallocated with M rows, and M is missing",
                 "give the Loop a trip count (an upper bound suffices when the condition stops it earlier)")
    row_types = _probe_scan_rows(ctx, node, body, trip, cond, carried) if scans else []
    buffers = [row_buffer(ctx, node, trip, row_type, k) for k, row_type in enumerate(row_types)]
    results = _while(ctx, node, body, trip, cond, carried, buffers)
    iterations = results[0]
    finals = list(results[2 if cond is not None else 1:])
    values, gathered = finals[:len(carried)], finals[len(carried):]
    if gathered and _may_stop_early(body, cond):
        gathered = [_rows_written(ctx, node, b, iterations, k) for k, b in enumerate(gathered)]
    outputs = [mb.identity(x=v, name=ctx.name(node, f"v{k}")) for k, v in enumerate(values)]
    outputs += [mb.identity(x=g, name=ctx.name(node, f"scan{k}")) for k, g in enumerate(gathered)]
    return tuple(outputs) if len(outputs) != 1 else outputs[0]


def _while(ctx, node, body, trip, cond, carried, buffers, on_scans=None):
    """Build the while_loop; returns its outputs (iteration, [condition], carried..., buffers...).

    What MIL may assume about the loop variables is settled first by throwaway builds (see
    ``_loop_state``) when any of them starts from a value known at build time."""
    with_cond = cond is not None
    initial = [mb.const(val=np.int32(0), name=ctx.name(node, "i0"))]
    if with_cond:
        initial.append(cond if isinstance(cond, Var) else mb.const(val=cond, name=ctx.name(node, "cond0")))
    loop_vars = tuple(initial + carried + buffers)
    state = LoopState(list(loop_vars))
    while not state.settled:  # each probe forgets a value or widens a dim, so this ends
        probe = _build(ctx, node, body, trip, with_cond, len(carried), loop_vars, state, learn=True)
        op = probe[0].op
        op.enclosing_block.remove_ops([op])
    return _build(ctx, node, body, trip, with_cond, len(carried), loop_vars, state, on_scans=on_scans)


def _build(ctx, node, body, trip, with_cond, count, loop_vars, state, learn=False, on_scans=None):
    """One ``while_loop``. When ``learn``, the body's outputs teach ``state`` and the loop gives its
    inputs back unchanged, so MIL has nothing to rebuild (the probe is removed afterwards)."""

    def keep_going(i, *rest):
        state.prepare((i, *rest))
        running = mb.less(x=i, y=trip, name=ctx.name(node, "in_range")) if trip is not None else None
        if not with_cond:
            return running
        return rest[0] if running is None else mb.logical_and(x=running, y=rest[0], name=ctx.name(node, "keep"))

    def step(i, *rest):
        state.prepare((i, *rest))
        condition = rest[0] if with_cond else np.bool_(True)
        loop_state = rest[1:] if with_cond else rest
        values, held = list(loop_state[:count]), list(loop_state[count:])
        outputs = pin_declared_shapes(ctx, node, body, ctx.lower_subgraph(body, [i, condition, *values]))
        new_values, scans = outputs[1:1 + count], outputs[1 + count:]
        if on_scans is not None:
            on_scans(scans)
        written = [write_row(ctx, node, b, i, s, k) for k, (b, s) in enumerate(zip(held, scans))]
        following = [mb.add(x=i, y=np.int32(1), name=ctx.name(node, "next_i"))]
        if with_cond:
            following.append(_scalar_bool(ctx, node, outputs[0], "cond_out"))
        following = [v if isinstance(v, Var) else mb.const(val=v, name=ctx.name(node, "cond_const")) for v in following]
        inputs = (i, *rest)
        results = [like_input(ctx, node, out, before, j)
                   for j, (out, before) in enumerate(zip(following + list(new_values) + written, inputs))]
        if learn:
            state.learn(inputs, results)
            return inputs
        return tuple(state.hide_constants(ctx, node, inputs, results))

    try:
        results = mb.while_loop(_cond=keep_going, _body=step, loop_vars=loop_vars, name=ctx.name(node, "loop"))
        return results if isinstance(results, (list, tuple)) else (results,)  # one loop variable: a Var alone
    except ValueError as exc:  # MIL's message names the variable whose type changes
        if "changes in the body" in str(exc) or "subtype" in str(exc):
            ctx.fail(node, "a loop-carried value changes rank or type between iterations, which Core ML's "
                     f"while_loop cannot carry ({exc})")
        raise


def _probe_scan_rows(ctx, node, body, trip, cond, carried) -> list:
    """The types of the scan rows, from a throwaway build of the loop without buffers."""
    seen: list = []

    def remember(scans):  # MIL may build the body twice (once more after a shape change): keep the last
        seen[:] = scans

    probe = _while(ctx, node, body, trip, cond, carried, [], on_scans=remember)
    row_types = [(s.dtype, s.shape) for s in seen]
    op = probe[0].op
    op.enclosing_block.remove_ops([op])
    check_row_types(ctx, node, row_types)
    return row_types






def _rows_written(ctx, node, buffer, iterations, k):
    """buffer[:iterations] (the loop stopped on its condition, perhaps before M)."""
    rank = buffer.rank
    end = mb.reshape(x=iterations, shape=[1], name=ctx.name(node, f"n_1d{k}"))
    if rank > 1:
        end = mb.concat(values=[end, np.zeros(rank - 1, np.int32)], axis=0, name=ctx.name(node, f"scan_end{k}"))
    return mb.slice_by_index(x=buffer, begin=np.zeros(rank, np.int32), end=end,
                             end_mask=[False] + [True] * (rank - 1), name=ctx.name(node, f"scan_rows{k}"))
