"""Integer constants a backend cannot hold, saturated to its range where the graph provably discards them.

Exported models compute sentinels no 32-bit integer holds. T5's relative-position buckets take
``Log(0) = -inf`` cast to int64 (-2**63) and select it away with ``Min`` and ``Where``; graphs
pick ``INT64_MAX`` away with ``Where`` or clamp it with ``Min``/``Clip``. Once pinned shapes fold such
arithmetic, the sentinel is a constant that a backend with 32-bit integers (Core ML) must refuse,
unless replacing it by the nearest value it can hold changes nothing the graph computes. This pass
first folds the integer work next to such a value that is computable at build time (onnxscript's
folding stops at a ``ConstantOfShape``; Core ML's lowering evaluates it and meets -2**63), then
proves the rest by following each constant through its readers, and saturates what it proves.

Each integer tensor on the way gets a :class:`Span`: per element (or one summary for the whole
tensor), bounds of the value the source graph computes, bounds of the value the backend computes
with the saturated constants (in its integer width, wrapping where that overflows), and whether the
two may differ. An element that may differ must be selected away (``Where``), clamped to one value in
both (``Min``/``Max``/``Clip`` against a bound beyond both, a comparison or a Cast to bool decided
alike in both) or reach a ``Slice`` bound (clamped to the dimension). Reaching a graph output, a
float value, an op without a rule here or an operand whose value is a parameter (indices, shapes)
leaves the constant as it is; the nodes reading it are marked with the reason
(:func:`int_range_reason`), which the backend's refusal names. A run-time integer is taken to hold
what the backend's integers hold (a 64-bit input is an int32 there): the backend's own premise.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

INT_RANGE = "edgebuild.int_range"  # node metadata key: why a constant it reads keeps values outside the range
MAX_ELEMENTS = 1 << 20  # a larger tensor's span is one summary for all its elements
_EXACT = 2.0 ** 53  # float64 holds every integer below this; beyond, bounds are rounded outward
# Beyond this, float64 bounds cannot tell a 64-bit result that wrapped from one that did not (2**63 - 1
# and 2**63 are one float): arithmetic reaching it may have wrapped
_HUGE = 2.0 ** 62
_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Sum"}
_BOOLEAN = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Not", "And", "Or"}


def int_range_reason(node: ir.Node) -> str | None:
    """Why a constant ``node`` reads still holds values outside the backend's integer range, or None."""
    return node.metadata_props.get(INT_RANGE)


class Unproven(Exception):
    """A value that may differ reaches ``node``, which cannot be shown to discard it."""

    def __init__(self, node: ir.Node | None, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason

    def describe(self) -> str:
        if self.node is None:
            return self.reason
        domain = f"{self.node.domain}::" if self.node.domain else ""
        return f"node {self.node.name or '<unnamed>'!r} ({domain}{self.node.op_type}) {self.reason}"


@dataclass
class Span:
    """What one tensor's elements may be, each an array of the tensor's shape (or of shape () for one
    summary of every element): bounds where both graphs compute the same value (``lo``, ``hi``), and,
    where they may differ (``differs``), bounds of the source graph's value (``olo``, ``ohi``) and of
    the saturated graph's (``slo``, ``shi``) in those executions. An empty bound is (inf, -inf)."""

    lo: np.ndarray
    hi: np.ndarray
    olo: np.ndarray
    ohi: np.ndarray
    slo: np.ndarray
    shi: np.ndarray
    differs: np.ndarray

    @classmethod
    def same(cls, lo, hi) -> "Span":
        lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        shape = np.broadcast_shapes(lo.shape, hi.shape)
        empty_lo, empty_hi = np.full(shape, np.inf), np.full(shape, -np.inf)
        return cls(lo, hi, empty_lo, empty_hi, empty_lo, empty_hi, np.zeros(shape, bool))

    @classmethod
    def of_array(cls, array: np.ndarray) -> "Span":
        lo, hi = _as_bounds(np.asarray(array))
        if lo.size > MAX_ELEMENTS:
            lo, hi = lo.min(initial=np.inf), hi.max(initial=-np.inf)
        return cls.same(lo, hi)

    @property
    def any_differs(self) -> bool:
        return bool(np.any(self.differs))

    def parts(self) -> tuple[np.ndarray, ...]:
        return self.lo, self.hi, self.olo, self.ohi, self.slo, self.shi, self.differs

    def full(self, shape) -> "Span":
        return Span(*(np.broadcast_to(part, shape) for part in self.parts()))

    def summary(self) -> "Span":
        lows, highs = (np.min(self.lo), np.min(self.olo), np.min(self.slo)), (np.max(self.hi), np.max(self.ohi),
                                                                               np.max(self.shi))
        return Span(lows[0], highs[0], lows[1], highs[1], lows[2], highs[2], np.any(self.differs))

    def world(self, saturated: bool) -> tuple[np.ndarray, np.ndarray]:
        """Bounds of the value in the source graph (or the saturated one), in every execution."""
        lo, hi = (self.slo, self.shi) if saturated else (self.olo, self.ohi)
        return np.minimum(self.lo, lo), np.maximum(self.hi, hi)

    def agree_possible(self) -> np.ndarray:
        return self.lo <= self.hi


def _union(spans: list[Span]) -> Span:
    lows = [functools.reduce(np.minimum, [s.parts()[k] for s in spans]) for k in (0, 2, 4)]
    highs = [functools.reduce(np.maximum, [s.parts()[k] for s in spans]) for k in (1, 3, 5)]
    return Span(lows[0], highs[0], lows[1], highs[1], lows[2], highs[2],
                functools.reduce(np.logical_or, [s.differs for s in spans]))


def _as_bounds(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 bounds of an integer or bool array: the value itself, or the floats either side of it
    where float64 cannot hold it (beyond 2**53)."""
    values = array.astype(np.float64)
    lo, hi = values, values
    if array.dtype.kind in "iu" and array.size and np.abs(values).max() >= _EXACT:
        lo, hi = values.copy(), values.copy()
        for index in np.flatnonzero(np.abs(values) >= _EXACT):
            exact, rounded = int(array.flat[index]), float(values.flat[index])
            if int(rounded) > exact:
                lo.flat[index] = np.nextafter(rounded, -np.inf)
            elif int(rounded) < exact:
                hi.flat[index] = np.nextafter(rounded, np.inf)
    return lo, hi


def _down(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) >= _EXACT, np.nextafter(x, -np.inf), x)


def _up(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) >= _EXACT, np.nextafter(x, np.inf), x)


def _dtype_range(dtype: ir.DataType | None) -> tuple[float, float] | None:
    """The integer range of ``dtype`` (bool as 0..1), None for a float or unknown type."""
    if dtype == ir.DataType.BOOL:
        return 0.0, 1.0
    if dtype is None or not dtype.is_integer():
        return None
    bits = dtype.bitwidth
    if dtype.is_signed():
        return -(2.0 ** (bits - 1)), 2.0 ** (bits - 1) - 1
    return 0.0, 2.0 ** bits - 1


def _wrap(lo, hi, low, high, type_low=None, type_high=None):
    """Bounds past ``low``..``high``: the value may have wrapped to anything in the type's range
    (``type_low``..``type_high``, by default the same); an empty bound stays empty."""
    outside = (lo <= hi) & ((lo < low) | (hi > high))
    type_low, type_high = (low, high) if type_low is None else (type_low, type_high)
    return np.where(outside, type_low, lo), np.where(outside, type_high, hi)


@dataclass
class IntRanges:
    """One graph's analysis, for a backend whose integers are ``bits`` wide."""

    graph: ir.Graph
    bits: int = 32
    candidates: dict[int, ir.Value] = field(default_factory=dict)
    spans: dict[int, Span] = field(default_factory=dict)

    @property
    def limit(self) -> tuple[float, float]:
        return -(2.0 ** (self.bits - 1)), 2.0 ** (self.bits - 1) - 1

    # -- the spans ----------------------------------------------------------------------------
    def span(self, value: ir.Value | None, depth: int = 0) -> Span:
        if value is None:
            return Span.same(-np.inf, np.inf)
        found = self.spans.get(id(value))
        if found is None:
            found = self._compute(value, depth)
            self.spans[id(value)] = found
        return found

    def _compute(self, value: ir.Value, depth: int) -> Span:
        array = _constant(value)
        if id(value) in self.candidates:
            low, high = self.limit
            saturated = np.clip(array, low, high) if array.dtype.kind == "i" else np.minimum(array, high)
            outside = array != saturated
            lo, hi = _as_bounds(array)
            slo, shi = _as_bounds(saturated)
            empty_lo, empty_hi = np.full(lo.shape, np.inf), np.full(lo.shape, -np.inf)
            return Span(np.where(outside, np.inf, lo), np.where(outside, -np.inf, hi),
                        np.where(outside, lo, np.inf), np.where(outside, hi, -np.inf),
                        np.where(outside, slo, empty_lo), np.where(outside, shi, empty_hi), outside)
        if array is not None and array.dtype.kind in "iub":
            return Span.of_array(array)
        node = value.producer()
        if node is not None and depth < 200 and node.op_type in _RULES and node.domain in ("", "ai.onnx"):
            self.evaluate(node, depth + 1)  # a differing input it cannot follow is a failure here too
            if id(value) in self.spans:
                return self.spans[id(value)]
        return self._top(value)

    def _top(self, value: ir.Value) -> Span:
        """Anything its type holds; a 64-bit integer the backend computes holds only its range."""
        bounds = _dtype_range(value.dtype)
        if bounds is None:
            return Span.same(-np.inf, np.inf)
        low, high = bounds
        return Span.same(max(low, self.limit[0]), min(high, self.limit[1]))

    def evaluate(self, node: ir.Node, depth: int = 0) -> list[Span]:
        """The spans of ``node``'s outputs (stored); raises Unproven when a differing input reaches an
        operand the node's rule cannot follow."""
        if all(id(v) in self.spans for v in node.outputs if v is not None):
            return [self.spans[id(v)] for v in node.outputs]
        rule = _RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                               for a in node.attributes.values()):
            raise Unproven(node, "has no range rule")
        inputs = [self.span(v, depth) if v is not None else None for v in node.inputs]
        with np.errstate(all="ignore"):  # bounds of impossible cases may be inf - inf: masked away
            outputs = rule(self, node, inputs)
        for value, result in zip(node.outputs, outputs):
            if value is not None and result is not None:
                self.spans[id(value)] = self._wrapped(value, result, node.op_type in _ARITHMETIC)
        return [self.spans.get(id(v)) for v in node.outputs]

    def _wrapped(self, value: ir.Value, span: Span, arithmetic: bool) -> Span:
        """The output type's range wraps the bounds: the source's type in the source graph, the
        backend's integers in the saturated one; 64-bit arithmetic whose bounds reach beyond 2**62
        may have wrapped too."""
        dtype = _dtype_of(value)
        bounds = _dtype_range(dtype)
        if bounds is None:
            if span.any_differs:
                kind = dtype.name if dtype is not None else "unknown type"
                raise Unproven(value.producer(), f"makes {kind} value {value.name!r} from them")
            return span
        low, high = bounds
        edge = (-_HUGE, _HUGE) if arithmetic and high > _HUGE else (low, high)
        lo, hi = _wrap(span.lo, span.hi, *edge, low, high)
        olo, ohi = _wrap(span.olo, span.ohi, *edge, low, high)
        slo, shi = _wrap(span.slo, span.shi, max(low, self.limit[0]), min(high, self.limit[1]))
        return Span(lo, hi, olo, ohi, slo, shi, span.differs)

    # -- the proof ------------------------------------------------------------------------------
    def follow(self, start: list[ir.Value]) -> None:
        """Follow every value that may differ to the readers of it; raises Unproven."""
        outputs = {id(v) for v in self.graph.outputs}
        pending = list(start)
        seen: set[int] = set()
        while pending:
            value = pending.pop()
            if id(value) in seen or not self.span(value).any_differs:
                continue
            seen.add(id(value))
            if id(value) in outputs:
                raise Unproven(None, f"graph output {value.name!r} keeps them")
            for node, _ in value.uses():
                if node.graph is not self.graph:
                    raise Unproven(node, "reads them inside a subgraph")
                self.evaluate(node)
                pending.extend(v for v in node.outputs if v is not None)


def _dtype_of(value: ir.Value | None, depth: int = 0) -> ir.DataType | None:
    """A value's type, or where the graph does not say (no shape inference ran) its producer's."""
    if value is None or value.dtype is not None or depth > 50:
        return value.dtype if value is not None else None
    return _output_dtype(value.producer(), depth + 1)


def _output_dtype(node: ir.Node | None, depth: int) -> ir.DataType | None:
    if node is None:
        return None
    if node.op_type == "Cast":
        return ir.DataType(node.attributes["to"].value)
    if node.op_type in _BOOLEAN:
        return ir.DataType.BOOL
    if node.op_type in ("Shape", "Size"):
        return ir.DataType.INT64
    if node.op_type == "ConstantOfShape":
        attribute = node.attributes.get("value")
        return attribute.value.dtype if attribute is not None else ir.DataType.FLOAT
    if node.op_type == "Constant" and "value" in node.attributes:
        return node.attributes["value"].value.dtype
    index = 1 if node.op_type == "Where" else 0
    return _dtype_of(node.inputs[index], depth) if len(node.inputs) > index else None


def _constant_tensor(value: ir.Value):
    """The tensor of an initializer or of a ``Constant`` node's ``value`` (None for anything else)."""
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx") \
            and "value" in producer.attributes:
        return producer.attributes["value"].value
    return None


def _constant(value: ir.Value) -> np.ndarray | None:
    tensor = _constant_tensor(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # an external tensor that cannot be read: not a constant here
        return None


# -- elementwise ops: one world's bounds function, applied case by case ---------------------------------
def _elementwise(bounds, inputs: list[Span], agrees=None) -> Span:
    """The span of an elementwise op whose bounds in one graph are ``bounds([(lo, hi), ...])``.

    Each case is a choice of which inputs differ; one where none does agrees. A differing case agrees
    where both graphs' bounds are the same single value, or where ``agrees(case, inputs)`` says so.
    """
    parts = []
    for case in itertools.product((False, True), repeat=len(inputs)):
        possible = np.ones((), bool)
        for span, differs in zip(inputs, case):
            possible = possible & (span.differs if differs else span.agree_possible())
        if not np.any(possible):
            continue
        source = bounds([(s.olo, s.ohi) if d else (s.lo, s.hi) for s, d in zip(inputs, case)])
        if not any(case):
            parts.append(_masked(source, source, possible, np.ones((), bool)))
            continue
        saturated = bounds([(s.slo, s.shi) if d else (s.lo, s.hi) for s, d in zip(inputs, case)])
        agreed = (source[0] == source[1]) & (saturated[0] == saturated[1]) & (source[0] == saturated[0])
        if agrees is not None:
            agreed = agreed | agrees(case, inputs)
        parts.append(_masked(source, saturated, possible, agreed))
    return _union(parts)


def _masked(source, saturated, possible, agreed) -> Span:
    """One case's part: agreeing where ``agreed``, differing elsewhere; empty where not ``possible``."""
    same, apart = possible & agreed, possible & ~agreed
    inf = np.inf
    return Span(np.where(same, np.minimum(source[0], saturated[0]), inf),
                np.where(same, np.maximum(source[1], saturated[1]), -inf),
                np.where(apart, source[0], inf), np.where(apart, source[1], -inf),
                np.where(apart, saturated[0], inf), np.where(apart, saturated[1], -inf), apart)


def _add_bounds(b):
    (alo, ahi), (blo, bhi) = b
    return _down(alo + blo), _up(ahi + bhi)


def _sub_bounds(b):
    (alo, ahi), (blo, bhi) = b
    return _down(alo - bhi), _up(ahi - blo)


def _mul_bounds(b):
    (alo, ahi), (blo, bhi) = b
    corners = [np.nan_to_num(c, nan=0.0) for c in np.broadcast_arrays(alo * blo, alo * bhi, ahi * blo, ahi * bhi)]
    return _down(np.minimum.reduce(corners)), _up(np.maximum.reduce(corners))  # nan: 0 * inf, the 0 bound


def _div_bounds(b):
    """trunc(a / b) for a divisor of one sign; anything otherwise."""
    (alo, ahi), (blo, bhi) = b
    one_sign = (blo > 0) | (bhi < 0)
    safe_lo, safe_hi = np.where(one_sign, blo, 1.0), np.where(one_sign, bhi, 1.0)
    corners = np.broadcast_arrays(*(np.trunc(x / y) for x in (alo, ahi) for y in (safe_lo, safe_hi)))
    lo, hi = _down(np.minimum.reduce(corners)), _up(np.maximum.reduce(corners))
    return np.where(one_sign, lo, -np.inf), np.where(one_sign, hi, np.inf)


def _min_bounds(b):
    (alo, ahi), (blo, bhi) = b
    return np.minimum(alo, blo), np.minimum(ahi, bhi)


def _max_bounds(b):
    (alo, ahi), (blo, bhi) = b
    return np.maximum(alo, blo), np.maximum(ahi, bhi)


def _min_agrees(case, inputs):
    """An operand the same in both graphs, at or below every value the other may take in either: the result."""
    (a_differs, b_differs), (a, b) = case, inputs
    if a_differs == b_differs:
        return np.zeros((), bool)
    same, other = (b, a) if a_differs else (a, b)
    return same.hi <= np.minimum(other.olo, other.slo)


def _max_agrees(case, inputs):
    (a_differs, b_differs), (a, b) = case, inputs
    if a_differs == b_differs:
        return np.zeros((), bool)
    same, other = (b, a) if a_differs else (a, b)
    return same.lo >= np.maximum(other.ohi, other.shi)


def _min(a: Span, b: Span) -> Span:
    return _elementwise(_min_bounds, [a, b], _min_agrees)


def _max(a: Span, b: Span) -> Span:
    return _elementwise(_max_bounds, [a, b], _max_agrees)


def _pairwise(function):
    """A rule for a variadic op from a two-operand one (Min, Max, Sum)."""
    def rule(analysis, node, inputs):
        present = [span for span in inputs if span is not None]
        result = present[0]
        for other in present[1:]:
            result = function(result, other)
        return [result]
    return rule


def _binary(bounds):
    def rule(analysis, node, inputs):
        return [_elementwise(bounds, inputs[:2])]
    return rule


def _unary(bounds):
    def rule(analysis, node, inputs):
        return [_elementwise(lambda b: bounds(*b[0]), inputs[:1])]
    return rule


def _neg_bounds(lo, hi):
    return -hi, -lo


def _abs_bounds(lo, hi):
    return np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0.0)), np.maximum(np.abs(lo), np.abs(hi))


def _clip(analysis, node, inputs):
    result = inputs[0]
    if len(inputs) > 1 and inputs[1] is not None:
        result = _max(result, inputs[1])
    if len(inputs) > 2 and inputs[2] is not None:
        result = _min(result, inputs[2])
    for name, function in (("min", _max), ("max", _min)):  # opset < 11
        if name in node.attributes:
            bound = node.attributes[name].value
            result = function(result, Span.same(bound, bound))
    return [result]


def _truth_bounds(true, false):
    """Bool bounds (0/1) from where the result is certainly true and certainly false."""
    return true.astype(np.float64), (~false).astype(np.float64)


def _comparison(less: bool, strict: bool):
    def bounds(b):
        (alo, ahi), (blo, bhi) = b if less else b[::-1]
        if strict:
            return _truth_bounds(ahi < blo, alo >= bhi)
        return _truth_bounds(ahi <= blo, alo > bhi)
    return _binary(bounds)


def _equal_bounds(b):
    (alo, ahi), (blo, bhi) = b
    return _truth_bounds((alo == ahi) & (blo == bhi) & (alo == blo), (ahi < blo) | (bhi < alo))


def _not_bounds(lo, hi):
    return 1 - hi, 1 - lo


def _where(analysis, node, inputs):
    """The same choice where the condition is the same in both graphs (its operand's cases carried
    whole); where the condition may differ, either operand in each graph."""
    condition, x, y = inputs
    parts = []
    agree = condition.agree_possible()
    may_true, may_false = agree & (condition.hi >= 1), agree & (condition.lo <= 0)
    for chosen, mask in ((x, may_true), (y, may_false)):
        if np.any(mask):
            parts.append(_only_where(chosen, mask))
    if condition.any_differs:
        def pick(bounds_c, bounds_x, bounds_y):
            (clo, chi), (xlo, xhi), (ylo, yhi) = bounds_c, bounds_x, bounds_y
            true, false = clo >= 1, chi <= 0
            return (np.where(true, xlo, np.where(false, ylo, np.minimum(xlo, ylo))),
                    np.where(true, xhi, np.where(false, yhi, np.maximum(xhi, yhi))))
        source = pick((condition.olo, condition.ohi), x.world(False), y.world(False))
        saturated = pick((condition.slo, condition.shi), x.world(True), y.world(True))
        agreed = (source[0] == source[1]) & (saturated[0] == saturated[1]) & (source[0] == saturated[0])
        parts.append(_masked(source, saturated, condition.differs, agreed))
    return [_union(parts)]


def _only_where(span: Span, mask) -> Span:
    inf = np.inf
    lows = [np.where(mask, part, inf) for part in (span.lo, span.olo, span.slo)]
    highs = [np.where(mask, part, -inf) for part in (span.hi, span.ohi, span.shi)]
    return Span(lows[0], highs[0], lows[1], highs[1], lows[2], highs[2], mask & span.differs)


def _cast(analysis, node, inputs):
    a = inputs[0]
    target = ir.DataType(node.attributes["to"].value)
    if target == ir.DataType.BOOL:
        return [_elementwise(lambda b: _truth_bounds((b[0][0] > 0) | (b[0][1] < 0), (b[0][0] == 0) & (b[0][1] == 0)),
                             [a])]
    if target.is_integer():
        return [a]  # the output type's range wraps what it cannot hold
    if a.any_differs:
        raise Unproven(node, f"casts them to {target.name}")
    return [Span.same(-np.inf, np.inf)]


def _shape_of(analysis, node, inputs):
    """Shape and Size read only the shape: the same in both."""
    source = node.inputs[0]
    dims = list(source.shape) if source is not None and source.shape is not None else None
    if dims is not None and all(isinstance(d, int) for d in dims):
        if node.op_type == "Size":
            return [Span.of_array(np.array(int(np.prod(dims)), np.int64))]
        start = node.attributes["start"].value if "start" in node.attributes else 0
        end = node.attributes["end"].value if "end" in node.attributes else None
        return [Span.of_array(np.array(dims[start:end], np.int64))]
    return [Span.same(0, analysis.limit[1])]


def _constant_of_shape(analysis, node, inputs):
    _need(node, inputs, 0, "shape")
    attribute = node.attributes.get("value")
    fill = attribute.value.numpy() if attribute is not None else np.zeros(1, np.float32)
    if fill.dtype.kind not in "iub":
        return [Span.same(-np.inf, np.inf)]
    lo, hi = _as_bounds(fill.reshape(()))
    return [Span.same(lo, hi)]


def _need(node: ir.Node, inputs, index: int, what: str) -> None:
    if index < len(inputs) and inputs[index] is not None and inputs[index].any_differs:
        raise Unproven(node, f"takes them as its {what}, a parameter whose value matters")


def _reduce(analysis, node, inputs):
    """ReduceMin (ReduceMax by negation): the same in both where an element the same in both lies at or
    below every value a differing element may take in either (the extreme then comes from the former)."""
    flip = node.op_type == "ReduceMax"
    data = _negated(inputs[0]) if flip else inputs[0]
    _need(node, inputs, 1, "axes")
    source = node.inputs[0]
    tensor = _constant_tensor(source)
    dims = source.shape if source.shape is not None or tensor is None else tensor.shape
    axes = _constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if axes is None and "axes" in node.attributes:
        axes = np.array(node.attributes["axes"].value)
    keepdims = node.attributes["keepdims"].value if "keepdims" in node.attributes else 1
    static = dims is not None and all(isinstance(d, int) for d in dims)
    if not static or (len(node.inputs) > 1 and node.inputs[1] is not None and axes is None):
        result = _reduced(data.summary().parts(), ())
    else:
        rank = len(dims)
        if axes is None or axes.size == 0:
            noop = node.attributes["noop_with_empty_axes"].value if "noop_with_empty_axes" in node.attributes else 0
            if axes is not None and noop:
                return [inputs[0]]
            axes = np.arange(rank)
        axes = sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)})
        kept = [a for a in range(rank) if a not in axes]
        moved = [np.transpose(part, kept + axes).reshape([dims[a] for a in kept] + [-1])
                 for part in data.full(tuple(dims)).parts()]
        result = _reduced(moved, [1 if a in axes else dims[a] for a in range(rank)] if keepdims else None)
    return [_negated(result) if flip else result]


def _reduced(parts, shape) -> Span:
    """The minimum over the last axis of ``parts`` (a Span's arrays), reshaped to ``shape`` if given."""
    lo, hi, olo, ohi, slo, shi, differs = (np.asarray(part) for part in parts)
    if lo.ndim == 0:
        lo, hi, olo, ohi, slo, shi, differs = (part.reshape(1) for part in (lo, hi, olo, ohi, slo, shi, differs))
    source = (np.minimum(lo, olo).min(-1), np.maximum(hi, ohi).min(-1))
    saturated = (np.minimum(lo, slo).min(-1), np.maximum(hi, shi).min(-1))
    settled = np.where(differs, np.inf, hi).min(-1)  # an element the same in both, at most this
    least_differing = np.where(differs, np.minimum(olo, slo), np.inf).min(-1)
    agreed = ~differs.any(-1) | (settled <= least_differing)
    result = _union([_masked(source, saturated, np.ones((), bool), agreed),
                     Span.same(np.minimum(source[0], saturated[0]), np.maximum(source[1], saturated[1]))])
    return result.full(result.lo.shape) if shape is None else Span(*(np.reshape(p, shape) for p in
                                                                       result.full(result.lo.shape).parts()))


def _negated(span: Span) -> Span:
    return Span(-span.hi, -span.lo, -span.ohi, -span.olo, -span.shi, -span.slo, span.differs)


# -- data movement: which inputs carry the elements; the others are constants that place them --------------
_MOVED_INPUTS = {
    "Identity": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Transpose": (0,),
    "Expand": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,), "Tile": (0,),
    "Split": (0,), "Concat": None,
}
_PARAMETERS = {"Reshape": "target shape", "Expand": "shape", "Gather": "indices", "GatherElements": "indices",
               "GatherND": "indices", "Tile": "repeats", "Squeeze": "axes", "Unsqueeze": "axes", "Split": "split sizes",
               "Slice": "bounds"}


def _moved(analysis, node, inputs):
    data = _MOVED_INPUTS[node.op_type]
    data = tuple(range(len(inputs))) if data is None else data
    for index in range(len(inputs)):
        if index in data:
            continue
        if node.op_type == "Slice" and index in (1, 2) and id(node.inputs[index]) in analysis.candidates:
            continue  # Slice clamps its bounds to the dimension: saturated, they select the same elements
        _need(node, inputs, index, _PARAMETERS.get(node.op_type, f"input {index}"))
    spans = [inputs[i] for i in data if i < len(inputs) and inputs[i] is not None]
    moved = _index_map(analysis, node, data)
    if moved is not None:
        shapes, maps = moved
        try:
            flat = [np.concatenate([span.full(shape).parts()[k].reshape(-1) for span, shape in zip(spans, shapes)])
                    for k in range(7)]
            return [Span(*(part[index_map] for part in flat)) for index_map in maps]
        except ValueError:  # a span that does not fit the shape the graph declares: summarise instead
            pass
    # shapes or placement unknown: every output element may be any input element
    merged = _union([span.summary() for span in spans])
    return [merged for _ in node.outputs]


def _index_map(analysis, node, data) -> tuple[list, list[np.ndarray]] | None:
    """Which input element each output element is (the data inputs' elements numbered one after
    another), from running the node itself on those numbers; None if shapes or the other operands
    are not known."""
    shapes, feeds, offset = [], {}, 0
    for index, value in enumerate(node.inputs):
        if value is None or value.name == "":
            continue
        if index in data:
            tensor = _constant_tensor(value)
            dims = value.shape if value.shape is not None or tensor is None else tensor.shape
            if dims is None or not all(isinstance(d, int) for d in dims) or int(np.prod(dims)) > MAX_ELEMENTS:
                return None
            size = int(np.prod(dims))
            feeds[value.name] = np.arange(offset, offset + size, dtype=np.int64).reshape(tuple(dims))
            shapes.append(tuple(dims))
            offset += size
        else:
            array = _constant(value)
            if array is None:
                return None
            if id(value) in analysis.candidates:
                array = np.clip(array, *analysis.limit).astype(array.dtype)
            feeds[value.name] = array
    try:
        results = _run_node(node, feeds)
    except Exception:  # the node does not evaluate on these operands: a summary instead
        return None
    return shapes, [np.asarray(result, np.int64) for result in results]


def _run_node(node: ir.Node, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnx
    from onnx.reference import ReferenceEvaluator

    graph = onnx.helper.make_graph(
        [ir.serde.serialize_node(node)], "moved",
        [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
         for name, array in feeds.items()],
        [onnx.helper.make_tensor_value_info(v.name, onnx.TensorProto.UNDEFINED, None) for v in node.outputs if v])
    opset = node.graph.opset_imports.get("", None) if node.graph is not None else None
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset or 18)])
    with np.errstate(all="ignore"):  # Log(0) and casts of -inf are what this pass is for
        return ReferenceEvaluator(model).run(None, feeds)


_RULES = {
    "Add": _binary(_add_bounds), "Sub": _binary(_sub_bounds), "Mul": _binary(_mul_bounds),
    "Div": _binary(_div_bounds), "Neg": _unary(_neg_bounds), "Abs": _unary(_abs_bounds),
    "Min": _pairwise(_min), "Max": _pairwise(_max), "Clip": _clip,
    "Sum": _pairwise(lambda a, b: _elementwise(_add_bounds, [a, b])),
    "Relu": lambda analysis, node, inputs: [_max(inputs[0], Span.same(0, 0))],
    "Less": _comparison(True, True), "LessOrEqual": _comparison(True, False),
    "Greater": _comparison(False, True), "GreaterOrEqual": _comparison(False, False), "Equal": _binary(_equal_bounds),
    "Not": _unary(_not_bounds), "And": _pairwise(_min), "Or": _pairwise(_max),  # on 0/1, And is Min and Or Max
    "Sign": _unary(lambda lo, hi: (np.sign(lo), np.sign(hi))), "ReduceMin": _reduce, "ReduceMax": _reduce,
    "Where": _where, "Cast": _cast, "Shape": _shape_of, "Size": _shape_of, "ConstantOfShape": _constant_of_shape,
    **{op: _moved for op in _MOVED_INPUTS},
}


# -- the pass ---------------------------------------------------------------------------------------
def out_of_range(value: ir.Value, bits: int) -> bool:
    """An integer constant with values a ``bits``-wide signed integer cannot hold."""
    tensor = _constant_tensor(value)
    bounds = _dtype_range(tensor.dtype) if tensor is not None else None
    if bounds is None or (bounds[0] >= -(2 ** (bits - 1)) and bounds[1] <= 2 ** (bits - 1) - 1):
        return False  # not an integer type wider than the limit: never read (weights are floats)
    array = _constant(value)
    if array is None or array.dtype.kind not in "iu" or not array.size:
        return False
    return bool(array.min() < -(2 ** (bits - 1)) or array.max() > 2 ** (bits - 1) - 1)


MAX_FOLDED = 512 * 512  # elements: onnxscript's own limit on a folded output
_NEVER_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                 "Bernoulli", "Dropout", "If", "Loop", "Scan", "SequenceConstruct"}


class BuildTimeValues:
    """The values a graph computes from constants and static shapes alone, evaluated node by node
    with onnx's reference evaluator (None: a run-time value, or one too large to evaluate here).

    onnxscript's folding leaves some of them (a ``ConstantOfShape``, an op reading a constant above
    its input size limit); a backend that evaluates them while lowering (Core ML does) then meets
    the out-of-range int64 intermediates of e.g. T5's bucket arithmetic as constants."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.values: dict[int, np.ndarray | None] = {}

    def of(self, value: ir.Value | None, depth: int = 0) -> np.ndarray | None:
        if value is None:
            return None
        if id(value) not in self.values:
            self.values[id(value)] = self._evaluate(value, depth)
        return self.values[id(value)]

    def _evaluate(self, value: ir.Value, depth: int) -> np.ndarray | None:
        array = _constant(value)
        if array is not None:
            return array
        node = value.producer()
        if node is None or node.graph is not self.graph or depth > 200 or node.domain not in ("", "ai.onnx") \
                or node.op_type in _NEVER_FOLDED or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                                                         for a in node.attributes.values()):
            return None
        if node.op_type in ("Shape", "Size"):
            dims = node.inputs[0].shape
            if dims is None or not all(isinstance(d, int) for d in dims):
                return None
            return _shape_of(None, node, [None])[0].lo.astype(np.int64)
        feeds = {}
        for source in node.inputs:
            if source is None or source.name == "":
                continue
            known = self.of(source, depth + 1)
            if known is None or known.size > MAX_FOLDED:
                return None
            feeds[source.name] = known
        try:
            results = _run_node(node, feeds)
        except Exception:  # not evaluable here: a run-time value as far as this pass is concerned
            return None
        for output, result in zip(node.outputs, results):
            if output is not None and output is not value:
                self.values[id(output)] = np.asarray(result)
        return np.asarray(results[list(node.outputs).index(value)])


def fold_around_out_of_range(graph: ir.Graph, bits: int = 32) -> int:
    """Fold the build-time values next to an out-of-range one, so no reader meets it at run time: a
    reader computed entirely at build time becomes its (in-range) results; an out-of-range value a
    run-time reader takes becomes a constant, for :func:`saturate_graph` to prove. Returns the folds."""
    known = BuildTimeValues(graph)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    outputs = {id(v) for v in graph.outputs}

    def out_of_range_array(array):
        return array is not None and array.dtype.kind in "iu" and array.size and (array.min() < low or array.max() > high)

    folds: dict[int, tuple[ir.Value, np.ndarray]] = {}
    values = [*graph.initializers.values(), *(v for node in graph for v in node.outputs if v is not None)]
    wide = {dtype for dtype in ir.DataType if (_dtype_range(dtype) or (0, 0))[1] > high}
    for value in values:
        if value.dtype is not None and value.dtype not in wide or not out_of_range_array(known.of(value)):
            continue
        for reader, _ in value.uses():
            if reader.graph is not graph:
                continue
            results = [known.of(output) for output in reader.outputs]
            if all(result is not None and result.dtype.kind in "iub" for result in results):  # integer work only
                for output, result in zip(reader.outputs, results):
                    if not out_of_range_array(result) and result.size <= MAX_FOLDED and id(output) not in outputs:
                        folds[id(output)] = (output, result)
            elif _constant(value) is None and id(value) not in outputs:
                folds[id(value)] = (value, known.of(value))
    taken = set(graph.initializers)
    for value, array in folds.values():
        name = value.name
        while name in taken:
            name = f"{name}_folded"
        taken.add(name)
        constant = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                            const_value=ir.tensor(array, name=name))
        graph.register_initializer(constant)
        value.replace_all_uses_with(constant)
    return len(folds)


def saturate_graph(graph: ir.Graph, bits: int = 32) -> tuple[list[ir.Value], dict[str, str]]:
    """Saturate the out-of-range integer constants of ``graph`` that its readers provably discard;
    returns the values saturated and, for each one kept, why (its name -> the reason)."""
    values = {id(v): v for v in graph.initializers.values() if out_of_range(v, bits)}
    for node in graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            values.update({id(v): v for v in node.outputs if out_of_range(v, bits)})
    kept: dict[str, str] = {}
    while values:
        # proven together, since one saturated constant may meet another; a failure blocks the
        # constants that fail on their own, else every constant that reaches where it failed
        failure = _failure(graph, bits, values)
        if failure is None:
            for value in values.values():
                _saturate(value, bits)
            return list(values.values()), kept
        alone = {id(v): _failure(graph, bits, {id(v): v}) for v in values.values()}
        blocked = {key: reason for key, reason in alone.items() if reason is not None}
        if not blocked:
            reached = [key for key, v in values.items() if _reaches(v, failure.node, graph)
                       or failure.node is None and _reaches_output(v, graph)]
            blocked = {key: failure for key in reached or values}
        for key, reason in blocked.items():
            kept[values.pop(key).name] = reason.describe()
    return [], kept


def _failure(graph: ir.Graph, bits: int, values: dict[int, ir.Value]) -> Unproven | None:
    try:
        IntRanges(graph, bits, candidates=dict(values)).follow(list(values.values()))
    except Unproven as exc:
        return exc
    except Exception as exc:  # a form the rules do not expect: nothing proven, the constants stay as they are
        return Unproven(None, f"stopped the range analysis: {type(exc).__name__}: {exc}")
    return None


def _downstream(value: ir.Value) -> tuple[set[int], set[int]]:
    """ids of the nodes and values reachable from ``value``."""
    nodes, values, pending = set(), {id(value)}, [value]
    while pending:
        current = pending.pop()
        for node, _ in current.uses():
            if id(node) in nodes:
                continue
            nodes.add(id(node))
            for output in node.outputs:
                if output is not None and id(output) not in values:
                    values.add(id(output))
                    pending.append(output)
    return nodes, values


def _reaches(value: ir.Value, node: ir.Node | None, graph: ir.Graph) -> bool:
    return node is not None and id(node) in _downstream(value)[0]


def _reaches_output(value: ir.Value, graph: ir.Graph) -> bool:
    reached = _downstream(value)[1]
    return any(id(output) in reached for output in graph.outputs)


def _saturate(value: ir.Value, bits: int) -> None:
    array = _constant(value)
    saturated = np.clip(array, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1).astype(array.dtype)
    tensor = ir.tensor(saturated, name=value.name)
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant":
        producer.attributes["value"] = ir.AttrTensor("value", tensor)
    value.const_value = tensor


def mark_kept(graph: ir.Graph, kept: dict[str, str], bits: int) -> None:
    """Record on the readers of each kept constant why it keeps values outside the range."""
    for value in [*graph.initializers.values(), *(v for n in graph for v in n.outputs)]:
        if value is not None and value.name in kept:
            for node, _ in value.uses():
                node.metadata_props[INT_RANGE] = (
                    f"the int{bits} range analysis could not show the graph discards them: {kept[value.name]}")


@dataclass
class SaturateDiscardedIntegers:
    """The registered pass (``edgebuild.protocols.GraphPass``): runs after constant folding, which is what
    turns shape arithmetic with sentinels into out-of-range constants."""

    name: str = "saturate_discarded_int64"
    description: str = (
        "int64 constants outside the int32 range (Log(0) cast to int64, INT64_MAX sentinels) that every "
        "reader provably selects or clamps away -> saturated to int32, which leaves every result unchanged"
    )
    bits: int = 32
    default: bool = True
    before_folding: bool = False
    min_opset: int | None = None

    def apply(self, model: ir.Model) -> int:
        folded = fold_around_out_of_range(model.graph, self.bits)
        if folded:
            import onnx_ir.passes.common as common_passes

            common_passes.RemoveUnusedNodesPass()(model)
        saturated, kept = saturate_graph(model.graph, self.bits)
        mark_kept(model.graph, kept, self.bits)
        return folded + len(saturated)


def graph_pass(name: str) -> SaturateDiscardedIntegers:
    """The core plugin's factory for this module's pass."""
    return SaturateDiscardedIntegers(name=name)
