"""Evaluate the eligibility rules of rules.yaml against one MIL op.

The rules (thresholds, op lists, messages, fixes and citations) are data; this module holds only
the check for each rule id. ``eligibility(op, chip)`` answers for the Neural Engine,
``gpu_eligibility(op, chip)`` for the GPU. The CPU runs every op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources

import yaml
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

from edgebuild_coreml.ane import mil_view
from edgebuild_coreml.ane.chips import ChipProfile, get_chip


@dataclass(frozen=True)
class Reason:
    """Why an op cannot run (``severity='fallback'``) or runs slowly (``'hint'``) on a unit."""

    rule: str
    message: str
    fix: str
    source: str
    severity: str = "fallback"
    unit: str = "ane"
    cost_factor: float = 1.0

    @property
    def blocking(self) -> bool:
        return self.severity == "fallback"

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("cost_factor")
        return data


@dataclass(frozen=True)
class RuleContext:
    """What a rule needs beyond the op: the chip, and which shape symbols are range-flexible."""

    chip: ChipProfile
    # sympy symbol -> name of the program input whose range shape introduced it
    dynamic_symbols: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class RuleBook:
    sources: dict
    constant_ops: frozenset
    ane: list
    gpu: list
    # constexpr op type -> units that read its weight compressed (see cost.weight_bytes)
    compressed_weights: dict = field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def load_rules() -> RuleBook:
    text = resources.files(__package__).joinpath("rules.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml's: 8x faster
    return RuleBook(
        sources=data["sources"],
        constant_ops=frozenset(data["constant_ops"]),
        ane=data["ane"],
        gpu=data["gpu"],
        compressed_weights={op: tuple(entry["units"]) for op, entry in data.get("compressed_weights", {}).items()},
    )


def compressed_weight_units() -> dict:
    """constexpr op type -> the units that read its weights compressed."""
    return load_rules().compressed_weights


def constant_op_types() -> frozenset:
    """Op types that only hold constant data; the planner skips them."""
    return load_rules().constant_ops


# --- checks: each returns a list of format-field dicts, one per finding -----------------------


def _activations(op) -> list:
    return mil_view.data_inputs(op) + mil_view.tensor_outputs(op)


def _is_integer_op(op) -> bool:
    """Shape/position arithmetic and comparisons: every output is an integer or bool."""
    outputs = {mil_view.dtype_name(v) for v in mil_view.tensor_outputs(op)}
    return bool(outputs) and not any(d.startswith("fp") for d in outputs)


def _check_dtype(op, params, ctx) -> list[dict]:
    allowed = set(params["compute_dtypes"])
    ignored = set(params.get("ignore_dtypes", ["int8", "uint8"]))
    if params.get("skip_integer") and _is_integer_op(op):
        return []
    if op.op_type == "cast":
        ends = {mil_view.dtype_name(v) for v in _activations(op)}
        if ends <= set(params["boundary_casts"]):
            return []
    seen = {mil_view.dtype_name(v) for v in mil_view.tensor_outputs(op)}
    seen |= {
        mil_view.dtype_name(v)
        for v in mil_view.data_inputs(op)
        if mil_view.dtype_name(v).startswith("fp")
    }
    bad = sorted(seen - allowed - ignored)
    return [{"dtype": ", ".join(bad)}] if bad else []


def _check_int_arithmetic(op, params, ctx) -> list[dict]:
    if not _is_integer_op(op):
        return []
    seen = sorted({mil_view.dtype_name(v) for v in _activations(op)} & set(params["int_dtypes"]))
    return [{"dtype": ", ".join(seen)}] if seen else []


def _state_var(op):
    """The state an op reads or writes (read_state's input, coreml_update_state's state)."""
    return op.inputs.get("input") if op.op_type == "read_state" else op.inputs.get("state")


def _check_state(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    state = _state_var(op)
    tensor = op.outputs[0]  # both ops return the state's tensor value
    shape = mil_view.shape_of(tensor)
    dtype = mil_view.dtype_name(tensor)
    last = shape[-1] if shape else None
    aligned = last is not None and not is_symbolic(last) and int(last) % params["multiple_of"] == 0
    if dtype in params["state_dtypes"] and aligned:
        return []
    described = f"{dtype} {[int(d) if not is_symbolic(d) else str(d) for d in shape]}"
    name = state.name if state is not None else "?"
    return [{"state": f"'{name}' ({described})"}]


def _written_extent(op) -> tuple[int, int] | None:
    """(axis, length) of the axis a slice_update writes part of: where update and target sizes differ."""
    target, update = mil_view.shape_of(op.inputs["x"]), mil_view.shape_of(op.inputs["update"])
    for axis, (whole, part) in enumerate(zip(target, update)):
        if is_symbolic(part):
            return axis, -1
        if is_symbolic(whole) or int(part) != int(whole):
            return axis, int(part)
    return None


def _check_slice_update(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    extent = _written_extent(op)
    if extent is None:
        return []
    axis, length = extent
    if 0 <= length <= params["max_update"]:
        return []
    return [{"axis": axis, "length": "an unknown number of" if length < 0 else length}]


def _check_attention_heads(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    shape = mil_view.shape_of(op.inputs["query"])
    if len(shape) < 4 or is_symbolic(shape[1]) or int(shape[1]) < 2:
        return []
    return [{"heads": int(shape[1])}]


def _check_compressed_input(op, params, ctx) -> list[dict]:
    producers = set(params["producers"])
    weights = [var.name for _, var in mil_view.input_vars(op) if var.op is not None and var.op.op_type in producers]
    return [{"weight": ", ".join(weights)}] if weights else []


def _check_int8(op, params, ctx) -> list[dict]:
    if ctx.chip.ane_int8_compute:
        return []
    int8 = set(params["int8_dtypes"])
    if any(mil_view.dtype_name(v) in int8 for v in _activations(op)):
        return [{}]
    return []


def _check_rank(op, params, ctx) -> list[dict]:
    rank = max((len(mil_view.shape_of(v)) for v in _activations(op)), default=0)
    return [{"rank": rank}] if rank > params["max_rank"] else []


def _check_dimension(op, params, ctx) -> list[dict]:
    dims = [
        int(d)
        for v in _activations(op)
        for d in mil_view.shape_of(v)
        if not is_symbolic(d)
    ]
    largest = max(dims, default=0)
    return [{"dim": largest}] if largest > params["max_dim"] else []


def _check_dynamic(op, params, ctx) -> list[dict]:
    if not ctx.dynamic_symbols:
        return []
    symbols = set().union(*(mil_view.symbols_in(v) for v in _activations(op)))
    inputs = sorted({ctx.dynamic_symbols[s] for s in symbols if s in ctx.dynamic_symbols})
    return [{"inputs": ", ".join(inputs)}] if inputs else []


def _check_pooling(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    kernel = list(mil_view.param(op, "kernel_sizes", []) or [])
    stride = list(mil_view.param(op, "strides", []) or [])
    if max(kernel, default=0) > params["max_kernel"] or max(stride, default=0) > params["max_stride"]:
        return [{"kernel": kernel, "stride": stride}]
    return []


def _upsampling_scale(op) -> float:
    if op.op_type.startswith("upsample_"):
        return max(
            float(mil_view.param(op, "scale_factor_height", 1)),
            float(mil_view.param(op, "scale_factor_width", 1)),
        )
    # resize_* ops give target sizes: compare the output's spatial dims with the input's.
    x = op.inputs.get("x")
    in_shape, out_shape = mil_view.shape_of(x), mil_view.shape_of(op.outputs[0])
    ratios = [
        int(o) / int(i)
        for i, o in zip(in_shape[-2:], out_shape[-2:])
        if not (is_symbolic(i) or is_symbolic(o)) and int(i) > 0
    ]
    return max(ratios, default=1.0)


def _check_upsampling(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    scale = _upsampling_scale(op)
    return [{"scale": f"{scale:g}x"}] if scale > params["max_scale"] else []


def _check_dilated(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    dilations = list(mil_view.param(op, "dilations", []) or [])
    return [{"dilations": dilations}] if any(d > 1 for d in dilations) else []


def _check_norm_epsilon(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    epsilon = mil_view.param(op, "epsilon")
    if epsilon is None or float(epsilon) >= params["min_epsilon"]:
        return []
    return [{"epsilon": _short_float(float(epsilon)), "suggested": _short_float(params["suggested"])}]


def _short_float(value: float) -> str:
    """1e-12 -> '1e-12', 1e-05 -> '1e-5': how people write epsilons."""
    text = f"{value:.3g}"
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


def _check_linear_rank3(op, params, ctx) -> list[dict]:
    if op.op_type not in params["ops"]:
        return []
    x = op.inputs.get("x")
    return [{}] if x is not None and len(mil_view.shape_of(x)) == 3 else []


# unsupported_op is not here: its message, fix and source vary per op group.
CHECKS: dict[str, Callable] = {
    "dtype": _check_dtype,
    "int8_compute": _check_int8,
    "rank": _check_rank,
    "dimension": _check_dimension,
    "dynamic_shape": _check_dynamic,
    "pooling": _check_pooling,
    "upsampling": _check_upsampling,
    "dilated_conv": _check_dilated,
    "norm_epsilon": _check_norm_epsilon,
    "linear_rank3": _check_linear_rank3,
    "int_arithmetic": _check_int_arithmetic,
    "state": _check_state,
    "slice_update": _check_slice_update,
    "attention_heads": _check_attention_heads,
    "blockwise_weights": _check_compressed_input,
}


# --- evaluation ----------------------------------------------------------------------------------


def _reason(rule: dict, texts: dict, fields: dict, unit: str, sources: dict) -> Reason:
    params = rule.get("params", {})
    return Reason(
        rule=rule["id"],
        message=texts["message"].format(**fields),
        fix=texts["fix"].format(**fields),
        source=sources.get(texts["source"], texts["source"]),
        severity=rule["severity"],
        unit=unit,
        cost_factor=float(params.get("cost_factor", 1.0)),
    )


def _unsupported_reasons(op, rule, base: dict, unit: str, sources: dict) -> list[Reason]:
    if mil_view.is_custom_op(op) and "custom_op" in rule:
        return [_reason(rule, rule["custom_op"], base, unit, sources)]
    for group in rule["groups"]:
        if op.op_type in group["ops"]:
            return [_reason(rule, group, base, unit, sources)]
    return []


def _evaluate(op, rules: list, unit: str, ctx: RuleContext) -> list[Reason]:
    sources = load_rules().sources
    base = {"op_type": op.op_type, "name": op.name, "chip": ctx.chip.display_name}
    reasons: list[Reason] = []
    for rule in rules:
        if rule["id"] == "unsupported_op":
            reasons += _unsupported_reasons(op, rule, base, unit, sources)
            continue
        params = rule.get("params", {})
        for found in CHECKS[rule["id"]](op, params, ctx):
            fields = {**params, **base, **found}
            reasons.append(_reason(rule, rule, fields, unit, sources))
    return reasons


def _context(chip, dynamic_symbols) -> RuleContext:
    return RuleContext(chip=get_chip(chip), dynamic_symbols=dict(dynamic_symbols or {}))


def eligibility(op, chip="m3", *, dynamic_symbols: Mapping | None = None) -> list[Reason]:
    """Reasons ``op`` cannot run (or runs slowly) on the Neural Engine of ``chip``; [] if none.

    ``dynamic_symbols`` maps the shape symbols of range-flexible inputs to the input's name
    (see ``plan.dynamic_symbol_map``); enumerated-shape inputs are simply left out of it.
    """
    return _evaluate(op, load_rules().ane, "ane", _context(chip, dynamic_symbols))


def gpu_eligibility(op, chip="m3", *, dynamic_symbols: Mapping | None = None) -> list[Reason]:
    """Reasons ``op`` cannot run on the GPU; [] if none."""
    return _evaluate(op, load_rules().gpu, "gpu", _context(chip, dynamic_symbols))
