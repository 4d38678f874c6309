"""ANE-friendly rewrites of a pymil Program, after Apple's ml-ane-transformers.

Each pass takes a Program, edits its main function in place and returns how many sites it
changed, so a caller can plan before and after (``plan.plan_program``) and show the effect.

- ``linear_to_conv``: linear on a rank-3 [B, S, C] input becomes a 1x1 conv in the
  (B, C, 1, S) layout the ANE prefers.
- ``split_attention_heads``: a multi-head attention (``scaled_dot_product_attention``, or the
  matmul -> [scale] -> softmax -> matmul chain) is computed per head, as ml-ane-transformers does.
- ``clamp_norm_epsilon``: norm epsilons that underflow in fp16 are raised to 1e-5. It changes the
  numbers slightly, so it runs only when asked for.
- ``ane_layout``: both layout rewrites, in the order Apple's reference applies them: linears as
  1x1 convs on (B, C, 1, S) (linears reading one tensor share its channels-first copy), then
  attention per head (grouped-query attention included). For a lowered decoder; outputs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.types.symbolic import any_symbolic, is_symbolic

from edgebuild_coreml.ane import mil_view

FP16_UNDERFLOW = 6.0e-8  # below the smallest fp16 subnormal (~5.96e-8) epsilon rounds to 0
NORM_OPS = ("layer_norm", "instance_norm", "batch_norm", "l2_norm")


def _replace(op, new_var, *, force: bool = False) -> None:
    """``force``: the old output hangs off a constexpr weight the caller replaces too (pymil
    refuses otherwise, guarding compressed weights)."""
    block = op.enclosing_block
    block.replace_uses_of_var_after_op(anchor_op=op, old_var=op.outputs[0], new_var=new_var, force_replace=force)
    block.remove_ops([op])


def _np_dtype(var):
    return np.float16 if mil_view.dtype_name(var) == "fp16" else np.float32


# --- linear -> 1x1 conv -----------------------------------------------------------------------


def _compressed_kernel(weight, op):
    """A [O, I] compressed weight rebuilt as a [O, I, 1, 1] conv kernel, still compressed; None if
    its constexpr is not one this knows (the linear then keeps its form)."""
    producer = weight.op
    kind = producer.op_type if producer is not None else None
    name = f"{op.name}_kernel"
    if kind == "constexpr_blockwise_shift_scale":
        arrays = {key: producer.inputs[key].val for key in ("data", "scale", "offset") if key in producer.inputs}
        if any(value is None for value in arrays.values()):
            return None
        return mb.constexpr_blockwise_shift_scale(
            **{key: value.reshape(*value.shape, 1, 1) for key, value in arrays.items()}, before_op=op, name=name)
    if kind == "constexpr_lut_to_dense" and "vector_axis" not in producer.inputs:
        indices, lut = producer.inputs["indices"].val, producer.inputs["lut"].val
        if indices is None or lut is None or indices.ndim != 2:
            return None
        # the table's rank is the indices' + 2: two more unit axes before the palette
        return mb.constexpr_lut_to_dense(indices=indices.reshape(*indices.shape, 1, 1),
                                         lut=lut.reshape(*lut.shape[:2], 1, 1, *lut.shape[2:]),
                                         before_op=op, name=name)
    return None


@dataclass
class _Layout:
    """What the (B, C, 1, S) rewrite has made so far in one function."""

    entries: dict = field(default_factory=dict)  # [B, S, C] var -> its (B, C, 1, S) copy
    exits: dict = field(default_factory=dict)  # [B, S, C] var rebuilt from a (B, C, 1, S) one -> that one


def _exit(bc1s, op, shape) -> object:
    """(B, O, 1, S) -> (B, 1, S, O) -> (B, S, O), named as ``op``'s output. Not squeeze + transpose,
    which coremltools' compose_conv1d would fold into a conv1d, squeezing a compressed kernel at
    run time."""
    out_shape = [int(d) if not is_symbolic(d) else -1 for d in shape]
    if out_shape.count(-1) <= 1:
        tokens_last = mb.transpose(x=bc1s, perm=[0, 2, 3, 1], before_op=op, name=f"{op.name}_from_bc1s")
        return mb.reshape(x=tokens_last, shape=out_shape, before_op=op, name=op.name)
    squeezed = mb.squeeze(x=bc1s, axes=[2], before_op=op, name=f"{op.name}_from_bc1s")  # two flexible dims
    return mb.transpose(x=squeezed, perm=[0, 2, 1], before_op=op, name=op.name)


def _linear_to_conv_site(op, layout: _Layout) -> bool:
    x, weight = op.inputs["x"], op.inputs["weight"]
    bias = op.inputs.get("bias")
    if len(mil_view.shape_of(x)) != 3 or any_symbolic(mil_view.shape_of(x)[-1:]):
        return False
    if bias is not None and bias.val is None:
        return False
    with op.enclosing_block:
        if weight.val is not None:
            out_features, in_features = weight.val.shape
            kernel = weight.val.reshape(out_features, in_features, 1, 1)
        else:
            kernel = _compressed_kernel(weight, op)
            if kernel is None:
                return False
        # linears reading one tensor share its channels-first copy; one made channels-first
        # by an earlier rewrite is read as it was
        bc1s = layout.exits.get(x) or layout.entries.get(x)
        if bc1s is None:
            bcs = mb.transpose(x=x, perm=[0, 2, 1], before_op=op, name=f"{op.name}_to_bcs")
            bc1s = layout.entries[x] = mb.expand_dims(x=bcs, axes=[2], before_op=op, name=f"{op.name}_to_bc1s")
        conv_args = {"x": bc1s, "weight": kernel, "before_op": op, "name": f"{op.name}_conv1x1"}
        if bias is not None:
            conv_args["bias"] = bias.val
        conv = mb.conv(**conv_args)
        result = _exit(conv, op, mil_view.shape_of(op.outputs[0]))
    layout.exits[result] = conv
    _replace(op, result, force=weight.val is None)
    producer = weight.op
    if producer is not None and producer.op_type.startswith("constexpr_") and not weight.child_ops:
        producer.enclosing_block.remove_ops([producer])  # its [O, I, 1, 1] copy replaced it
    return True


# elementwise ops computed on the channels-first tensors when every tensor they read has one
# (SwiGLU's silu(gate) * up between two convs), as Apple's reference keeps the MLP in (B, C, 1, S)
_SINKABLE = {"silu": ("x",), "relu": ("x",), "gelu": ("x",), "sigmoid": ("x",), "tanh": ("x",),
             "add": ("x", "y"), "mul": ("x", "y"), "sub": ("x", "y")}


def _same_shape(a, b) -> bool:
    """Equal static dims, flexible where the other is flexible (a reshape back from (B, C, 1, S)
    names the query length afresh): no operand broadcasts against another."""
    return len(a) == len(b) and all(
        (is_symbolic(x) and is_symbolic(y)) or (not is_symbolic(x) and not is_symbolic(y) and int(x) == int(y))
        for x, y in zip(a, b))


def _sink_elementwise_site(op, layout: _Layout) -> bool:
    operands = _SINKABLE.get(op.op_type)
    if operands is None:
        return False
    shape = mil_view.shape_of(op.outputs[0])
    args = dict(op.inputs)
    for name in operands:
        var = op.inputs[name]
        if var in layout.exits and _same_shape(mil_view.shape_of(var), shape):
            args[name] = layout.exits[var]
        elif var.val is None or np.size(var.val) != 1:
            return False  # a tensor with no channels-first copy, or one that broadcasts
    if not any(op.inputs[name] in layout.exits for name in operands):
        return False
    with op.enclosing_block:
        bc1s = getattr(mb, op.op_type)(**args, before_op=op, name=f"{op.name}_bc1s")
        result = _exit(bc1s, op, shape)
    layout.exits[result] = bc1s
    _replace(op, result)
    return True


def _drop_unused_exits(function, layout: _Layout) -> None:
    outputs = set(function.outputs)
    for var in list(layout.exits):
        if var.child_ops or var in outputs or var.op is None or var.op.enclosing_block is None:
            continue
        ops = [var.op]
        inner = var.op.inputs["x"]
        if len(inner.child_ops) == 1 and inner.op is not None:
            ops.append(inner.op)
        function.remove_ops(ops)


def _to_channels_first(prog, *, sink_elementwise: bool) -> int:
    function = mil_view.main_function(prog)
    layout = _Layout()
    count = 0
    for op in list(function.operations):
        if op.enclosing_block is None:
            continue
        if op.op_type == "linear":
            count += _linear_to_conv_site(op, layout)
        elif sink_elementwise:
            _sink_elementwise_site(op, layout)
    _drop_unused_exits(function, layout)
    return count


def linear_to_conv(prog) -> int:
    """Rewrite every linear on a rank-3 input as transpose/expand -> 1x1 conv -> transpose/reshape."""
    return _to_channels_first(prog, sink_elementwise=False)


# --- norm epsilon clamp -----------------------------------------------------------------------


def _clamp_site(op, minimum: float, below: float) -> bool:
    epsilon = mil_view.param(op, "epsilon")
    if epsilon is None or float(epsilon) >= below:
        return False
    args = {name: var for name, var in op.inputs.items()}
    args["epsilon"] = _np_dtype(op.inputs["x"])(minimum)
    with op.enclosing_block:
        new_var = getattr(mb, op.op_type)(**args, before_op=op, name=op.name)
    _replace(op, new_var)
    return True


def clamp_norm_epsilon(prog, minimum: float = 1e-5, below: float = FP16_UNDERFLOW) -> int:
    """Raise to ``minimum`` every norm epsilon smaller than ``below`` (fp16 underflow by default)."""
    function = mil_view.main_function(prog)
    targets = [op for op in list(function.operations) if op.op_type in NORM_OPS]
    return sum(_clamp_site(op, minimum, below) for op in targets)


# --- attention split per head -----------------------------------------------------------------


def _head_count(var) -> int | None:
    shape = mil_view.shape_of(var)
    if len(shape) != 4 or any_symbolic(shape[1:2]) or int(shape[1]) < 2:
        return None
    return int(shape[1])


def _split_heads(var, heads: int, op, name: str) -> list:
    return list(mb.split(x=var, num_splits=heads, axis=1, before_op=op, name=name))


def _kv_heads(var) -> int | None:
    shape = mil_view.shape_of(var)
    if len(shape) != 4 or any_symbolic(shape[1:2]):
        return None
    return int(shape[1])


def _split_sdpa(op) -> bool:
    query, key, value = (op.inputs[n] for n in ("query", "key", "value"))
    heads, kv_heads = _head_count(query), _kv_heads(key)
    # grouped-query attention: query head h reads key/value head h // (heads / kv_heads)
    if heads is None or kv_heads is None or _kv_heads(value) != kv_heads or heads % kv_heads:
        return False
    group = heads // kv_heads
    mask = op.inputs.get("attn_mask")
    mask_per_head = mask is not None and _head_count(mask) == heads
    with op.enclosing_block:
        qs = _split_heads(query, heads, op, f"{op.name}_q_heads")
        ks = _split_heads(key, kv_heads, op, f"{op.name}_k_heads") if kv_heads > 1 else [key]
        vs = _split_heads(value, kv_heads, op, f"{op.name}_v_heads") if kv_heads > 1 else [value]
        masks = _split_heads(mask, heads, op, f"{op.name}_mask_heads") if mask_per_head else None
        outputs = []
        for h in range(heads):
            args = dict(query=qs[h], key=ks[h // group], value=vs[h // group], before_op=op,
                        name=f"{op.name}_head{h}")
            if mask is not None:
                args["attn_mask"] = masks[h] if mask_per_head else mask
            outputs.append(mb.scaled_dot_product_attention(**args))
        merged = mb.concat(values=outputs, axis=1, before_op=op, name=op.name)
    _replace(op, merged)
    return True


def _sole_consumer(var):
    return var.child_ops[0] if len(var.child_ops) == 1 else None


def _match_attention_chain(scores_op):
    """matmul(q, k) -> [mul | real_div by a scalar const] -> softmax(last axis) -> matmul(., v)."""
    if scores_op.op_type != "matmul" or _head_count(scores_op.outputs[0]) is None:
        return None
    chain, current = [scores_op], _sole_consumer(scores_op.outputs[0])
    if current is not None and current.op_type in ("mul", "real_div"):
        scale = current.inputs["y"]
        if scale.val is None or np.size(scale.val) != 1 or current.inputs["x"] is not scores_op.outputs[0]:
            return None
        chain.append(current)
        current = _sole_consumer(current.outputs[0])
    if current is None or current.op_type != "softmax" or mil_view.param(current, "axis") not in (-1, 3):
        return None
    chain.append(current)
    weighted = _sole_consumer(current.outputs[0])
    if weighted is None or weighted.op_type != "matmul" or weighted.inputs["x"] is not current.outputs[0]:
        return None
    if mil_view.param(weighted, "transpose_x", False):
        return None
    chain.append(weighted)
    return chain


def _split_chain(chain) -> bool:
    first, last = chain[0], chain[-1]
    query, key, value = first.inputs["x"], first.inputs["y"], last.inputs["y"]
    heads = _head_count(first.outputs[0])
    if any(_head_count(v) != heads for v in (query, key, value)):
        return False
    with last.enclosing_block:
        qs = _split_heads(query, heads, first, f"{first.name}_q_heads")
        ks = _split_heads(key, heads, first, f"{first.name}_k_heads")
        vs = _split_heads(value, heads, first, f"{last.name}_v_heads")
        outputs = []
        for h in range(heads):
            scores = mb.matmul(
                x=qs[h], y=ks[h],
                transpose_x=bool(mil_view.param(first, "transpose_x", False)),
                transpose_y=bool(mil_view.param(first, "transpose_y", False)),
                before_op=last, name=f"{first.name}_head{h}",
            )
            for op in chain[1:-1]:
                if op.op_type == "softmax":
                    scores = mb.softmax(x=scores, axis=-1, before_op=last, name=f"{op.name}_head{h}")
                else:
                    scores = getattr(mb, op.op_type)(
                        x=scores, y=op.inputs["y"].val, before_op=last, name=f"{op.name}_head{h}"
                    )
            outputs.append(mb.matmul(
                x=scores, y=vs[h],
                transpose_y=bool(mil_view.param(last, "transpose_y", False)),
                before_op=last, name=f"{last.name}_head{h}",
            ))
        merged = mb.concat(values=outputs, axis=1, before_op=last, name=last.name)
    block = last.enclosing_block
    block.replace_uses_of_var_after_op(anchor_op=last, old_var=last.outputs[0], new_var=merged)
    block.remove_ops(list(reversed(chain)))
    return True


def split_attention_heads(prog) -> int:
    """Compute each multi-head attention one head at a time; returns the number of attentions split."""
    function = mil_view.main_function(prog)
    count = 0
    for op in list(function.operations):
        if op.enclosing_block is None:
            continue  # removed by an earlier rewrite in this loop
        if op.op_type == "scaled_dot_product_attention":
            count += _split_sdpa(op)
        elif (chain := _match_attention_chain(op)) is not None:
            count += _split_chain(chain)
    return count


def may_change_layout(prog) -> bool:
    """A cheap look for what ``ane_layout`` rewrites: a linear on a rank-3 input, an attention
    op, or a matmul with a rank-4 output (the start of an attention chain)."""
    for op in mil_view.main_function(prog).operations:
        if op.op_type == "linear" and len(mil_view.shape_of(op.inputs["x"])) == 3:
            return True
        if op.op_type == "scaled_dot_product_attention":
            return True
        if op.op_type == "matmul" and len(mil_view.shape_of(op.outputs[0])) == 4:
            return True
    return False


def ane_layout(prog) -> int:
    """Linears as 1x1 convs with the elementwise ops between them kept channels-first, then
    ``split_attention_heads``: Apple's ANE layout for a transformer. Returns the sites changed
    (linears and attentions)."""
    return _to_channels_first(prog, sink_elementwise=True) + split_attention_heads(prog)


REWRITES = {
    "linear_to_conv": linear_to_conv,
    "split_attention_heads": split_attention_heads,
    "clamp_norm_epsilon": clamp_norm_epsilon,
    "ane_layout": ane_layout,
}


def apply_rewrites(prog, names) -> dict[str, int]:
    """Run the named rewrites in order; returns {name: sites changed}. The names are
    compute.rewrites', checked at load against ``compute.REWRITE_NAMES`` (these keys)."""
    return {name: REWRITES[name](prog) for name in names}
