"""What ONNX's LSTM, GRU and RNN share: attributes, per-direction operands, output layout.

Registers nothing. ``rnn.py`` picks a lowering (MIL's fused op, or the step-by-step unroll
in ``_recurrent_unrolled.py``); both hand per-direction results to :func:`assemble_outputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, shape_of

# ONNX activation name -> (uses alpha, uses beta, default alpha, default beta). The defaults
# are onnxruntime's (the reference models are validated against), which differ from the
# standalone operators' for ThresholdedRelu, Affine and ScaledTanh.
_PARAMETRIC = {
    "affine": (True, True, 0.0, 0.0),
    "leakyrelu": (True, False, 0.01, None),
    "thresholdedrelu": (True, False, 0.0, None),
    "scaledtanh": (True, True, 0.0, 0.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, None),
}
_PLAIN = {"relu", "tanh", "sigmoid", "softsign", "softplus"}


@dataclass(frozen=True)
class Activation:
    """One ONNX recurrent activation with its (resolved) alpha and beta."""

    name: str  # lower-case ONNX name
    alpha: float | None = None
    beta: float | None = None

    @property
    def mil_simple(self) -> str | None:
        """The MIL fused ops' activation string when it means exactly this, else None."""
        return self.name if self.name in ("relu", "tanh", "sigmoid") else None

    def apply(self, x, name: str):
        """Build the activation on ``x`` (MIL ops follow the ONNX operators of the same name)."""
        n, a, b = self.name, self.alpha, self.beta
        if n in ("relu", "tanh", "sigmoid", "softsign", "softplus"):
            return getattr(mb, n)(x=x, name=name)
        if n == "affine":
            return mb.linear_activation(x=x, alpha=a, beta=b, name=name)
        if n == "leakyrelu":
            return mb.leaky_relu(x=x, alpha=a, name=name)
        if n == "thresholdedrelu":
            return mb.thresholded_relu(x=x, alpha=a, name=name)
        if n == "scaledtanh":
            return mb.scaled_tanh(x=x, alpha=a, beta=b, name=name)
        if n == "hardsigmoid":
            return mb.sigmoid_hard(x=x, alpha=a, beta=b, name=name)
        return mb.elu(x=x, alpha=a, name=name)


@dataclass
class RecurrentSpec:
    """The attributes and operands one ONNX recurrent node resolves to."""

    hidden: int
    directions: list[str]  # per direction: "forward" or "reverse"
    layout: int
    steps: int | object  # a MIL symbol when flexible
    batch: int | object
    x: object  # time-major [T, B, I] Var
    activations: list[list[Activation]]  # per direction
    clip: float | None
    lengths: object = None  # None when every sequence is full length; else [B] int32 (Var or numpy)
    dtype: type = np.float32

    @property
    def num_directions(self) -> int:
        return len(self.directions)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _activations(ctx, node, defaults: list[str], directions: int) -> list[list[Activation]]:
    """Per-direction activations. Alphas and betas are consumed in order by the activations
    that take them (onnxruntime's reading of the spec); missing ones take the op defaults."""
    names = [_text(a).lower() for a in (ctx.attr(node, "activations") or [])]
    if not names:
        names = defaults * directions
    per_direction = len(defaults)
    if len(names) != per_direction * directions:
        ctx.fail(node, f"activations lists {len(names)} functions; expected {per_direction} per direction "
                 f"for {directions} direction(s)")
    alphas = list(ctx.attr(node, "activation_alpha") or [])
    betas = list(ctx.attr(node, "activation_beta") or [])
    resolved = []
    for name in names:
        if name in _PLAIN:
            resolved.append(Activation(name))
            continue
        if name not in _PARAMETRIC:
            ctx.fail(node, f"activation {name!r} is not an ONNX recurrent activation")
        uses_alpha, uses_beta, alpha, beta = _PARAMETRIC[name]
        if uses_alpha and alphas:
            alpha = float(alphas.pop(0))
        if uses_beta and betas:
            beta = float(betas.pop(0))
        resolved.append(Activation(name, alpha, beta))
    return [resolved[d * per_direction:(d + 1) * per_direction] for d in range(directions)]


def parse(ctx, node, *, default_activations: list[str]) -> RecurrentSpec:
    """Read the attributes shared by LSTM/GRU/RNN; X is made time-major."""
    x = as_float(ctx.input(node, 0))
    direction = _text(ctx.attr(node, "direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        ctx.fail(node, f"unknown direction {direction!r}")
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    layout = int(ctx.attr(node, "layout", 0))
    shape = shape_of(x)
    if len(shape) != 3:
        ctx.fail(node, f"{node.op_type} needs a rank-3 input; this one has rank {len(shape)}")
    # A flexible sequence length suits Core ML's fused op; the exact unroll needs it static.
    steps, batch = (shape[0], shape[1]) if layout == 0 else (shape[1], shape[0])
    if isinstance(x, np.ndarray):
        x = mb.const(val=x, name=ctx.name(node, "x"))
    if layout == 1:
        x = mb.transpose(x=x, perm=[1, 0, 2], name=ctx.name(node, "time_major"))
    clip = ctx.attr(node, "clip")
    spec = RecurrentSpec(
        hidden=int(ctx.attr(node, "hidden_size")), directions=directions, layout=layout, steps=steps, batch=batch,
        x=x, activations=_activations(ctx, node, default_activations, len(directions)),
        clip=None if clip is None else float(clip), dtype=float_np(x),
    )
    spec.lengths = _sequence_lengths(ctx, node, steps)
    return spec


def _sequence_lengths(ctx, node, steps: int):
    """sequence_lens as int32 [B], or None when it is absent or every sequence is full length."""
    lengths = ctx.input(node, 4, optional=True)
    if lengths is None:
        return None
    if isinstance(lengths, np.ndarray) or getattr(lengths, "val", None) is not None:
        lengths = np.asarray(getattr(lengths, "val", lengths)).astype(np.int32)
        if np.any(lengths < 0) or (isinstance(steps, int) and np.any(lengths > steps)):
            ctx.fail(node, f"sequence_lens {lengths.tolist()} lies outside [0, {steps}]")
        return None if np.all(lengths == steps) else lengths
    return lengths if lengths.dtype == "int32" else mb.cast(x=lengths, dtype="int32", name=ctx.name(node, "lens"))


def is_constant(value) -> bool:
    return value is None or isinstance(value, np.ndarray) or getattr(value, "val", None) is not None


def constant(value) -> np.ndarray | None:
    if value is None:
        return None
    return np.asarray(getattr(value, "val", value)).astype(np.float32)


def per_direction(ctx, node, value, d: int, tag: str, axis: int = 0):
    """``value[d]`` along ``axis`` (the ONNX direction axis), for a constant or a Var."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return np.take(value, d, axis=axis)
    return mb.gather(x=value, indices=np.int32(d), axis=axis, name=ctx.name(node, f"{tag}_d{d}"))


def initial_state(ctx, node, index: int, spec: RecurrentSpec, d: int, tag: str):
    """Direction ``d``'s initial state [B, H] (zeros when the input is absent)."""
    state = as_float(ctx.input(node, index, optional=True))
    if state is None:
        if not isinstance(spec.batch, int):
            ctx.fail(node, f"{node.op_type} without an initial state needs a static batch size to make one",
                     "pin the batch dim in the recipe, or feed the initial state")
        return np.zeros([spec.batch, spec.hidden], spec.dtype)
    return per_direction(ctx, node, state, d, tag, axis=0 if spec.layout == 0 else 1)


def assemble_outputs(ctx, node, spec: RecurrentSpec, sequences: list, finals: list[list]) -> tuple:
    """ONNX outputs from per-direction results.

    ``sequences[d]``: [T, B, H] in input time order (None if Y is unused); ``finals[k][d]``:
    [B, H] for Y_h (k=0) and, for LSTM, Y_c (k=1). Layout 0 gives Y [T, D, B, H] and states
    [D, B, H]; layout 1 gives Y [B, T, D, H] and states [B, D, H].
    """
    outputs = list(node.outputs)
    results: list = [None] * len(outputs)

    def wanted(k):
        return k < len(outputs) and outputs[k] is not None and outputs[k].name != ""

    if wanted(0):
        axis = 1 if spec.layout == 0 else 2
        if spec.layout == 1:
            sequences = [mb.transpose(x=s, perm=[1, 0, 2], name=ctx.name(node, f"y_bt{d}")) for d, s in enumerate(sequences)]
        results[0] = _stack(ctx, node, sequences, axis, "")
    for k, states in enumerate(finals, start=1):
        if wanted(k):
            results[k] = _stack(ctx, node, states, 0 if spec.layout == 0 else 1, "y_h" if k == 1 else "y_c")
    return tuple(results)


def _stack(ctx, node, values: list, axis: int, tag: str):
    values = [v if not isinstance(v, np.ndarray) else mb.const(val=v) for v in values]
    if len(values) == 1:
        return mb.expand_dims(x=values[0], axes=[axis], name=ctx.name(node, tag))
    return mb.stack(values=values, axis=axis, name=ctx.name(node, tag))

