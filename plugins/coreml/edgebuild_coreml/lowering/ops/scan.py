"""ONNX Scan onto MIL ``while_loop`` (the body lowered with the converter's ``lower_subgraph``).

Each scan input is turned so its scan axis comes first (reversed for a reverse direction); the
loop reads row ``i`` of each with ``gather``. Loop variables are ``(i, states..., buffers...)``:
a MIL loop variable keeps its shape, so each scan output is collected into a buffer of T rows
preallocated from its row type, found by building the loop once without buffers (that probe is
then removed), as ``loop.py`` does for Loop. Opset 8's Scan adds a leading batch axis: each batch
row runs its own loop (the batch size must be known), and ``sequence_lens`` is not supported.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.var import Var

from edgebuild_coreml.lowering.ops._util import (
    dim,
    is_static,
    normalize_axis,
    rank_of,
    shape_of,
)
from edgebuild_coreml.lowering.ops._loop_rows import check_row_types, pin_declared_shapes, row_buffer, write_row
from edgebuild_coreml.lowering.registry import lowers



def _as_var(ctx, node, value, tag):
    return value if isinstance(value, Var) else mb.const(val=np.asarray(value), name=ctx.name(node, tag))


def _moved_to_front(ctx, node, x, axis: int, tag: str):
    if axis == 0:
        return x
    perm = [axis] + [d for d in range(rank_of(x)) if d != axis]
    return mb.transpose(x=x, perm=perm, name=ctx.name(node, tag))


def _moved_from_front(ctx, node, x, axis: int, tag: str):
    if axis == 0:
        return x
    rest = list(range(1, rank_of(x)))
    perm = rest[:axis] + [0] + rest[axis:]
    return mb.transpose(x=x, perm=perm, name=ctx.name(node, tag))


def _loop(ctx, node, body, states, sequences, length, row_types=None, on_rows=None):
    """The while_loop over ``length`` rows; returns (the loop op, final states, buffers) — no
    buffers when ``row_types`` is None (the probe), which reports the rows it sees to ``on_rows``."""
    count = len(states)
    buffers = [] if row_types is None else [row_buffer(ctx, node, length, t, k) for k, t in enumerate(row_types)]

    def keep_going(i, *rest):
        return mb.less(x=i, y=length, name=ctx.name(node, "in_range"))

    def step(i, *rest):
        carried, held = list(rest[:count]), list(rest[count:])
        rows = [mb.gather(x=s, indices=i, axis=0, name=ctx.name(node, f"row_in{k}")) for k, s in enumerate(sequences)]
        outputs = pin_declared_shapes(ctx, node, body, ctx.lower_subgraph(body, carried + rows))
        new_states, scanned = outputs[:count], outputs[count:]
        if on_rows is not None:
            on_rows(scanned)
        written = [write_row(ctx, node, b, i, r, k) for k, (b, r) in enumerate(zip(held, scanned))]
        return tuple([mb.add(x=i, y=np.int32(1), name=ctx.name(node, "next_i"))] + list(new_states) + written)

    start = mb.const(val=np.int32(0), name=ctx.name(node, "i0"))
    try:
        results = mb.while_loop(_cond=keep_going, _body=step, loop_vars=tuple([start] + states + buffers),
                                name=ctx.name(node, "loop"))
    except ValueError as exc:  # MIL names the variable whose type changes
        if "changes in the body" in str(exc) or "subtype" in str(exc):
            ctx.fail(node, f"a state changes rank or type between iterations, which Core ML's while_loop cannot carry ({exc})")
        raise
    results = [results] if isinstance(results, Var) else list(results)  # one loop variable comes back bare
    return results[0].op, list(results[1:1 + count]), list(results[1 + count:])




def _row_types(ctx, node, body, states, sequences, length):
    seen: list = []

    def remember(rows):  # MIL may build the body twice: keep the last
        seen[:] = rows

    op, _, _ = _loop(ctx, node, body, states, sequences, length, on_rows=remember)
    op.enclosing_block.remove_ops([op])
    row_types = [(r.dtype, r.shape) for r in seen]
    check_row_types(ctx, node, row_types)
    return row_types






def _scan(ctx, node, body, states, inputs, attrs):
    """One Scan (opset 9 semantics) over unbatched ``states`` and ``inputs``."""
    in_axes, in_dirs, out_axes, out_dirs = attrs
    sequences = []
    for k, x in enumerate(inputs):
        x = _as_var(ctx, node, x, f"scan_in{k}")
        x = _moved_to_front(ctx, node, x, normalize_axis(ctx, node, in_axes[k], rank_of(x)), f"in_front{k}")
        if in_dirs[k]:
            x = mb.reverse(x=x, axes=[0], name=ctx.name(node, f"in_reversed{k}"))
        sequences.append(x)
    lengths = [shape_of(s)[0] for s in sequences]
    static = [d for d in lengths if is_static(d)]
    if len(set(static)) > 1:
        ctx.fail(node, f"the scan inputs have different lengths {static} along their scan axes")
    length = np.int32(static[0]) if static else dim(sequences[0], 0, name=ctx.name(node, "length"))
    states = [_as_var(ctx, node, s, f"state_in{k}") for k, s in enumerate(states)]
    scans = len(body.outputs) - len(states)
    if len(body.inputs) != len(states) + len(sequences) or scans < 0:
        ctx.fail(node, f"the body takes {len(body.inputs)} inputs and gives {len(body.outputs)} outputs for "
                 f"{len(states)} states and {len(sequences)} scan inputs")
    row_types = _row_types(ctx, node, body, states, sequences, length) if scans else []
    _, finals, buffers = _loop(ctx, node, body, states, sequences, length, row_types=row_types)
    outputs = []
    for k, gathered in enumerate(buffers):
        if out_dirs[k]:
            gathered = mb.reverse(x=gathered, axes=[0], name=ctx.name(node, f"out_reversed{k}"))
        axis = normalize_axis(ctx, node, out_axes[k], rank_of(gathered))
        outputs.append(_moved_from_front(ctx, node, gathered, axis, f"out_axis{k}"))
    return finals, outputs


def _attrs(ctx, node, inputs: int, outputs: int):
    def ints(name, count):
        values = ctx.attr(node, name)
        values = [0] * count if values is None else [int(v) for v in values]
        if len(values) != count:
            ctx.fail(node, f"{name} has {len(values)} entries for {count} scan values")
        return values

    direction_name = "scan_input_directions" if node.attributes.get("scan_input_directions") is not None else "directions"
    return (ints("scan_input_axes", inputs), ints(direction_name, inputs), ints("scan_output_axes", outputs),
            ints("scan_output_directions", outputs))


@lowers("Scan", since=9)
def scan(ctx, node):
    body = ctx.attr(node, "body")
    count = int(ctx.attr(node, "num_scan_inputs"))
    values = [ctx.input(node, k) for k in range(len(node.inputs))]
    states, inputs = values[:len(values) - count], values[len(values) - count:]
    attrs = _attrs(ctx, node, count, len(body.outputs) - len(states))
    finals, outputs = _scan(ctx, node, body, states, inputs, attrs)
    results = [mb.identity(x=v, name=ctx.name(node, f"state{k}")) for k, v in enumerate(finals)] + outputs
    return tuple(results) if len(results) != 1 else results[0]


@lowers("Scan", since=8, until=8)
def scan_batched(ctx, node):
    """Opset 8: a leading batch axis on every state and scan input; one loop per batch row."""
    body = ctx.attr(node, "body")
    count = int(ctx.attr(node, "num_scan_inputs"))
    if ctx.has_input(node, 0):
        ctx.fail(node, "sequence_lens (per-row scan lengths) is not supported", "leave sequence_lens out")
    values = [_as_var(ctx, node, ctx.input(node, k), f"in{k}") for k in range(1, len(node.inputs))]
    states = values[:len(values) - count]
    batch = shape_of(values[0])[0]
    if not is_static(batch):
        ctx.fail(node, "the batch size must be known when the model is built", "pin the input shapes in the recipe")
    in_axes, in_dirs, out_axes, out_dirs = _attrs(ctx, node, count, len(body.outputs) - len(states))
    per_row = []
    for b in range(int(batch)):
        row = [mb.gather(x=v, indices=np.int32(b), axis=0, name=ctx.name(node, f"b{b}_{k}")) for k, v in enumerate(values)]
        per_row.append(_scan(ctx, node, body, row[:len(states)], row[len(states):], (in_axes, in_dirs, out_axes, out_dirs)))
    finals = [mb.stack(values=[r[0][k] for r in per_row], axis=0, name=ctx.name(node, f"state{k}"))
              for k in range(len(states))]
    outputs = [mb.stack(values=[r[1][k] for r in per_row], axis=0, name=ctx.name(node, f"scan{k}"))
               for k in range(len(per_row[0][1]))] if per_row else []
    results = finals + outputs
    return tuple(results) if len(results) != 1 else results[0]
