"""LSTM, GRU and RNN unrolled over the static sequence: one batched matmul for every step's
input projection, then per step a recurrent matmul and the gate arithmetic.

This is the exact path for what MIL's fused ops cannot say (runtime weights, per-sequence
lengths, gate clipping, coupled input/forget gates, GRU's linear_before_reset, parametric or
per-direction activations). Registers nothing; ``rnn.py`` calls :func:`run`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._recurrent import Activation, RecurrentSpec

# step(ctx, x_projected [B, G*H], states tuple, t) -> new states tuple (hidden state first)
Step = Callable[[object, tuple, int], tuple]


def part(ctx, node, value, k: int, size: int, axis: int, tag: str):
    """The ``k``-th block of ``size`` along ``axis`` (numpy slice or MIL slice_by_size)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return np.take(value, np.arange(k * size, (k + 1) * size), axis=axis)
    rank = value.rank
    axis %= rank
    begin = [k * size if i == axis else 0 for i in range(rank)]
    sizes = [size if i == axis else -1 for i in range(rank)]
    return mb.slice_by_size(x=value, begin=begin, size=sizes, name=ctx.name(node, tag))


def add(ctx, node, a, b, tag: str):
    """a + b, folding at build time when both are constants (either may be None)."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a + b
    return mb.add(x=a, y=b, name=ctx.name(node, tag))


class Cell:
    """Builds the ops of one direction; ``activate`` applies an activation with ONNX's clip."""

    def __init__(self, ctx, node, spec: RecurrentSpec, d: int):
        if not isinstance(spec.steps, int):
            ctx.fail(node, f"this {node.op_type} (its activations, clip, sequence_lens or runtime weights) has no "
                           "fused Core ML op and is unrolled, which needs a static sequence length",
                     "pin the sequence length in the recipe, or use enumerated shapes")
        self.ctx, self.node, self.spec, self.d = ctx, node, spec, d

    def name(self, tag: str, t: int) -> str:
        return self.ctx.name(self.node, f"d{self.d}_t{t}_{tag}")

    def const(self, value) -> np.ndarray:
        return np.asarray(value, self.spec.dtype)

    def activate(self, activation: Activation, x, tag: str, t: int, clip: bool = True):
        """``activation(clip(x))``; ONNX (as onnxruntime reads it) clips every gate's input,
        but not the cell state LSTM's output activation reads."""
        if clip and self.spec.clip is not None:
            x = mb.clip(x=x, alpha=self.const(-self.spec.clip), beta=self.const(self.spec.clip),
                        name=self.name(tag + "_clip", t))
        return activation.apply(x, self.name(tag, t))

    def matmul(self, x, weight, tag: str, t: int):
        """x [B, K] @ weight[N, K]^T."""
        weight = weight.astype(self.spec.dtype) if isinstance(weight, np.ndarray) else weight
        return mb.matmul(x=x, y=weight, transpose_y=True, name=self.name(tag, t))

    def input_projection(self, w, bias):
        """X [T, B, I] @ W^T (+ bias) for every step at once, split into T tensors [B, G*H]."""
        node, spec = self.node, self.spec
        w = w.astype(spec.dtype) if isinstance(w, np.ndarray) else w
        projected = mb.matmul(x=spec.x, y=w, transpose_y=True, name=self.ctx.name(node, f"d{self.d}_xw"))
        if bias is not None:
            bias = bias.astype(spec.dtype) if isinstance(bias, np.ndarray) else bias
            projected = mb.add(x=projected, y=bias, name=self.ctx.name(node, f"d{self.d}_xwb"))
        if spec.steps == 1:
            pieces = [projected]
        else:
            pieces = mb.split(x=projected, num_splits=spec.steps, axis=0, name=self.ctx.name(node, f"d{self.d}_steps"))
        return [mb.squeeze(x=p, axes=[0], name=self.ctx.name(node, f"d{self.d}_x{t}")) for t, p in enumerate(pieces)]


def run(cell: Cell, step: Step, projected: list, initial: tuple) -> tuple[object, tuple]:
    """Run one direction over the sequence; returns (Y [T, B, H] in input order, final states).

    With sequence_lens, steps at or past a sequence's length keep its state and emit zeros,
    which is ONNX's rule for both directions (a reverse pass starts at its last valid step).
    """
    spec = cell.spec
    order = range(spec.steps) if spec.directions[cell.d] == "forward" else range(spec.steps - 1, -1, -1)
    states = tuple(s.astype(spec.dtype) if isinstance(s, np.ndarray) else s for s in initial)
    outputs = [None] * spec.steps
    for t in order:
        new = step(projected[t], states, t)
        if spec.lengths is None:
            outputs[t] = new[0]
        else:
            valid = _valid(cell, t)
            new = tuple(mb.select(cond=valid, a=n, b=o, name=cell.name(f"keep{k}", t))
                        for k, (n, o) in enumerate(zip(new, states)))
            outputs[t] = mb.select(cond=valid, a=new[0], b=cell.const(0), name=cell.name("y", t))
        states = new
    sequence = mb.stack(values=outputs, axis=0, name=cell.ctx.name(cell.node, f"d{cell.d}_y"))
    return sequence, _zero_empty_sequences(cell, states)


def _zero_empty_sequences(cell: Cell, states: tuple) -> tuple:
    """onnxruntime reports zero final states for a sequence of length 0 (not the initial ones)."""
    lengths = cell.spec.lengths
    if lengths is None or (isinstance(lengths, np.ndarray) and np.all(lengths > 0)):
        return states
    if isinstance(lengths, np.ndarray):
        started = (lengths > 0).reshape(-1, 1)
    else:
        started = mb.expand_dims(x=mb.greater(x=lengths, y=np.int32(0), name=cell.ctx.name(cell.node, f"d{cell.d}_started")),
                                 axes=[1], name=cell.ctx.name(cell.node, f"d{cell.d}_started_b1"))
    return tuple(mb.select(cond=started, a=s, b=cell.const(0), name=cell.ctx.name(cell.node, f"d{cell.d}_final{k}"))
                 for k, s in enumerate(states))


def _valid(cell: Cell, t: int):
    """[B, 1] bool: which sequences are still running at step t."""
    lengths = cell.spec.lengths
    if isinstance(lengths, np.ndarray):
        return (t < lengths).reshape(-1, 1)
    running = mb.greater(x=lengths, y=np.int32(t), name=cell.name("running", t))
    return mb.expand_dims(x=running, axes=[1], name=cell.name("running_b1", t))


# -- the three cells ------------------------------------------------------------------------
def lstm_step(cell: Cell, r, peepholes, input_forget: bool) -> Step:
    """ONNX LSTM (gates i, o, f, c): c' = f*c + i*g(z); h' = o*h(c'); peepholes on i, f (old c), o (new c)."""
    f_act, g_act, h_act = cell.spec.activations[cell.d]
    p_i, p_o, p_f = (peepholes if peepholes is not None else (None, None, None))

    def peep(gate, p, c, tag, t):
        if p is None:
            return gate
        return mb.add(x=gate, y=mb.mul(x=c, y=p, name=cell.name(tag + "_pc", t)), name=cell.name(tag + "_peep", t))

    def step(x, states, t):
        h, c = states
        gates = mb.add(x=x, y=cell.matmul(h, r, "hr", t), name=cell.name("gates", t))
        gi, go, gf, gc = mb.split(x=gates, num_splits=4, axis=-1, name=cell.name("split", t))
        i = cell.activate(f_act, peep(gi, p_i, c, "i", t), "i", t)
        if input_forget:
            f = mb.sub(x=cell.const(1), y=i, name=cell.name("f", t))
        else:
            f = cell.activate(f_act, peep(gf, p_f, c, "f", t), "f", t)
        z = cell.activate(g_act, gc, "z", t)
        c_new = mb.add(x=mb.mul(x=f, y=c, name=cell.name("fc", t)), y=mb.mul(x=i, y=z, name=cell.name("iz", t)),
                       name=cell.name("c", t))
        o = cell.activate(f_act, peep(go, p_o, c_new, "o", t), "o", t)
        h_new = mb.mul(x=o, y=cell.activate(h_act, c_new, "hc", t, clip=False), name=cell.name("h", t))
        return h_new, c_new

    return step


def gru_step(cell: Cell, r_zr, r_h, recurrent_h_bias, linear_before_reset: bool) -> Step:
    """ONNX GRU (gates z, r, h). The candidate applies the reset gate to the hidden state
    (linear_before_reset=0) or to its projection plus recurrent bias (=1)."""
    f_act, g_act = cell.spec.activations[cell.d]

    def step(x, states, t):
        (h,) = states
        xz, xr, xh = mb.split(x=x, num_splits=3, axis=-1, name=cell.name("split", t))
        hz, hr = mb.split(x=cell.matmul(h, r_zr, "hzr", t), num_splits=2, axis=-1, name=cell.name("hsplit", t))
        z = cell.activate(f_act, mb.add(x=xz, y=hz, name=cell.name("zin", t)), "z", t)
        r = cell.activate(f_act, mb.add(x=xr, y=hr, name=cell.name("rin", t)), "r", t)
        if linear_before_reset:
            projected = cell.matmul(h, r_h, "hh", t)
            if recurrent_h_bias is not None:
                projected = mb.add(x=projected, y=recurrent_h_bias, name=cell.name("hhb", t))
            reset = mb.mul(x=r, y=projected, name=cell.name("rhh", t))
        else:
            reset = cell.matmul(mb.mul(x=r, y=h, name=cell.name("rh", t)), r_h, "rhh", t)
        candidate = cell.activate(g_act, mb.add(x=xh, y=reset, name=cell.name("hin", t)), "hcand", t)
        # h' = (1 - z) * candidate + z * h  ==  candidate + z * (h - candidate)
        delta = mb.mul(x=z, y=mb.sub(x=h, y=candidate, name=cell.name("hdiff", t)), name=cell.name("zdiff", t))
        return (mb.add(x=candidate, y=delta, name=cell.name("h", t)),)

    return step


def rnn_step(cell: Cell, r) -> Step:
    """ONNX RNN: h' = f(x W^T + h R^T + Wb + Rb)."""
    (f_act,) = cell.spec.activations[cell.d]

    def step(x, states, t):
        (h,) = states
        total = mb.add(x=x, y=cell.matmul(h, r, "hr", t), name=cell.name("in", t))
        return (cell.activate(f_act, total, "h", t),)

    return step
