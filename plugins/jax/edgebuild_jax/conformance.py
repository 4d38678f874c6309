"""The ``stablehlo`` conformance suite: cases generated from ``jax.lax`` primitives.

Each primitive is exported with ``jax.export`` over its dtype and attribute variants, converted
by this plugin, and paired with the outputs JAX computes on the CPU; the backend's conformance
runner then judges the converted graph as it judges the ONNX node tests. A case the converters
refuse is reported unsupported with their message.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

from edgebuild_jax.conformance_integers import KINDS, integer_variants, needs_x64

F32, F16, I32, BOOL = np.float32, np.float16, np.int32, np.bool_


def _arrays(seed: int, *specs):
    """Arrays for (shape, dtype[, kind]) specs: kind "positive" keeps floats above 0.1 and integers
    above 0; the integer kinds of ``conformance_integers.KINDS`` draw their own values."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        shape, dtype, kind = (*spec, None)[:3]
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            out.append(rng.random(shape) < 0.5)
        elif kind in KINDS:
            out.append(KINDS[kind](dtype.type, rng))
        elif dtype.kind in "iu":
            low = 1 if kind == "positive" else (0 if dtype.kind == "u" else -9)
            out.append(rng.integers(low, 10, shape).astype(dtype))
        else:
            values = rng.standard_normal(shape)
            out.append((np.abs(values) + 0.1 if kind == "positive" else values).astype(dtype))
    return [np.asarray(a) for a in out]  # 0-d draws come back as numpy scalars


def _variants() -> Iterator[tuple[str, str, Callable, list]]:
    """(primitive, variant, function, input specs) for every case."""
    import jax
    from jax import lax

    unary = {"abs": lax.abs, "neg": lax.neg, "exp": lax.exp, "tanh": lax.tanh, "logistic": lax.logistic,
             "sin": lax.sin, "cos": lax.cos, "floor": lax.floor, "ceil": lax.ceil, "sign": lax.sign,
             "round": lax.round, "expm1": lax.expm1, "log1p": lax.log1p, "is_finite": lax.is_finite,
             "erf": lax.erf, "tan": lax.tan}
    positive = {"log": lax.log, "sqrt": lax.sqrt, "rsqrt": lax.rsqrt, "cbrt": lax.cbrt}
    for name, fn in unary.items():
        for dtype in (F32, F16):
            yield name, np.dtype(dtype).name, fn, [((3, 5), dtype)]
    for name, fn in positive.items():
        for dtype in (F32, F16):
            yield name, np.dtype(dtype).name, fn, [((3, 5), dtype, "positive")]
    binary = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "max": lax.max, "min": lax.min}
    for name, fn in binary.items():
        for dtype in (F32, F16, I32):
            yield name, np.dtype(dtype).name, fn, [((4, 6), dtype), ((4, 6), dtype)]
    for dtype in (F32, I32):
        yield "div", np.dtype(dtype).name, lax.div, [((4, 6), dtype), ((4, 6), dtype, "positive")]
        yield "rem", np.dtype(dtype).name, lax.rem, [((4, 6), dtype), ((4, 6), dtype, "positive")]
    yield "pow", "float32", lax.pow, [((4, 6), F32, "positive"), ((4, 6), F32)]
    yield "atan2", "float32", lax.atan2, [((4, 6), F32), ((4, 6), F32)]
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        for dtype in (F32, I32):
            yield name, np.dtype(dtype).name, getattr(lax, name), [((4, 6), dtype), ((4, 6), dtype)]
    for name in ("and", "or", "xor"):
        fn = getattr(lax, f"bitwise_{name}")
        for dtype in (BOOL, I32):
            yield f"bitwise_{name}", np.dtype(dtype).name, fn, [((4, 6), dtype), ((4, 6), dtype)]
    for dtype in (BOOL, I32):
        yield "bitwise_not", np.dtype(dtype).name, lax.bitwise_not, [((4, 6), dtype)]
    yield from integer_variants()  # shifts, and the other integer primitives over every width
    yield "select_n", "float32", lambda p, a, b: lax.select_n(p, a, b), [((4, 6), BOOL), ((4, 6), F32), ((4, 6), F32)]
    yield "clamp", "scalar_bounds", lambda x: lax.clamp(np.float32(-0.5), x, np.float32(0.5)), [((4, 6), F32)]
    yield "clamp", "tensor_bounds", lambda lo, x: lax.clamp(lo, x, lo + 1), [((4, 6), F32), ((4, 6), F32)]
    for source, target in ((F32, I32), (F32, F16), (I32, F32), (BOOL, F32), (F16, F32), (F32, BOOL)):
        yield ("convert_element_type", f"{np.dtype(source).name}_to_{np.dtype(target).name}",
               lambda x, t=target: lax.convert_element_type(x * 3 if x.dtype != bool else x, t), [((4, 6), source)])
    yield "reduce_precision", "bf16", lambda x: lax.reduce_precision(x, 8, 7), [((4, 6), F32)]
    yield "reduce_precision", "f16", lambda x: lax.reduce_precision(x, 5, 10), [((4, 6), F32)]

    dots = {"matmul": ((4, 5), (5, 3), (((1,), (0,)), ((), ()))),
            "batched": ((2, 4, 5), (2, 5, 3), (((2,), (1,)), ((0,), (0,)))),
            "batch_last": ((4, 5, 2), (5, 3, 2), (((1,), (0,)), ((2,), (2,)))),
            "two_contracting": ((3, 4, 5), (4, 5, 2), (((1, 2), (0, 1)), ((), ()))),
            "vector": ((5,), (5,), (((0,), (0,)), ((), ())))}
    for variant, (lhs, rhs, dims) in dots.items():
        for dtype in (F32, F16):
            yield ("dot_general", f"{variant}_{np.dtype(dtype).name}",
                   lambda a, b, d=dims: lax.dot_general(a, b, d), [(lhs, dtype), (rhs, dtype)])
    convs = {"nchw_valid": ((1, 3, 9, 9), (4, 3, 3, 3), dict(window_strides=(1, 1), padding="VALID")),
             "nchw_same_stride2": ((1, 3, 9, 9), (4, 3, 3, 3), dict(window_strides=(2, 2), padding="SAME")),
             "explicit_padding": ((1, 3, 8, 8), (4, 3, 3, 3), dict(window_strides=(1, 1), padding=((2, 1), (0, 1)))),
             "rhs_dilation": ((1, 3, 9, 9), (4, 3, 3, 3),
                              dict(window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 2))),
             "grouped": ((1, 4, 8, 8), (6, 2, 3, 3),
                         dict(window_strides=(1, 1), padding="SAME", feature_group_count=2)),
             "depthwise": ((1, 4, 8, 8), (4, 1, 3, 3),
                           dict(window_strides=(1, 1), padding="SAME", feature_group_count=4)),
             "conv1d": ((2, 3, 10), (5, 3, 3), dict(window_strides=(2,), padding="SAME")),
             "lhs_dilation": ((1, 3, 5, 5), (4, 3, 3, 3),
                              dict(window_strides=(1, 1), padding=((2, 2), (2, 2)), lhs_dilation=(2, 2)))}
    for variant, (lhs, rhs, kwargs) in convs.items():
        yield ("conv_general_dilated", variant, lambda x, w, k=kwargs: lax.conv_general_dilated(x, w, **k),
               [(lhs, F32), (rhs, F32)])
    yield ("conv_general_dilated", "nhwc_hwio",
           lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
           [((1, 8, 8, 3), F32), ((3, 3, 3, 4), F32)])

    for axes in ((0,), (1,), (0, 2), (0, 1, 2)):
        for name, fn in (("reduce_sum", lax.reduce_sum), ("reduce_max", lax.reduce_max),
                         ("reduce_min", lax.reduce_min), ("reduce_prod", lax.reduce_prod)):
            yield name, f"axes_{'_'.join(map(str, axes))}", lambda x, a=axes, f=fn: f(x, a), [((3, 4, 5), F32)]
    for name, fn in (("reduce_and", lax.reduce_and), ("reduce_or", lax.reduce_or)):
        yield name, "axis_1", lambda x, f=fn: f(x, (1,)), [((3, 4), BOOL)]
    for axis in (0, 1):
        for name, fn in (("argmax", lax.argmax), ("argmin", lax.argmin)):
            yield name, f"axis_{axis}", lambda x, a=axis, f=fn: f(x, a, np.int32), [((4, 6), F32)]
    windows = {"max_2x2_stride2": (lax.max, -np.inf, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
               "max_3x3_same": (lax.max, -np.inf, (1, 1, 3, 3), (1, 1, 1, 1), "SAME"),
               "sum_2x2": (lax.add, 0.0, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
               "max_nhwc": (lax.max, -np.inf, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")}
    for variant, (op, init, window, strides, padding) in windows.items():
        yield ("reduce_window", variant,
               lambda x, o=op, i=init, w=window, s=strides, p=padding: lax.reduce_window(x, np.float32(i), o, w, s, p),
               [((1, 3, 8, 8), F32)])
    yield "cumsum", "axis_1", lambda x: lax.cumsum(x, 1), [((3, 6), F32)]

    yield "broadcast_in_dim", "new_leading", lambda x: lax.broadcast_in_dim(x, (2, 3, 4), (1, 2)), [((3, 4), F32)]
    yield "broadcast_in_dim", "expand_ones", lambda x: lax.broadcast_in_dim(x, (3, 5), (0, 1)), [((3, 1), F32)]
    yield "reshape", "merge", lambda x: lax.reshape(x, (6, 4)), [((2, 3, 4), F32)]
    yield "transpose", "permute", lambda x: lax.transpose(x, (2, 0, 1)), [((2, 3, 4), F32)]
    yield "slice", "strided", lambda x: lax.slice(x, (0, 1), (4, 6), (2, 2)), [((5, 7), F32)]
    yield "dynamic_slice", "traced_start", lambda x, i: lax.dynamic_slice(x, (i, np.int32(1)), (2, 3)), \
        [((5, 7), F32), ((), I32, "positive")]
    yield "dynamic_slice", "clamped_start", lambda x: lax.dynamic_slice(x, (np.int32(9), np.int32(-3)), (2, 3)), \
        [((5, 7), F32)]
    yield "dynamic_update_slice", "traced_start", \
        lambda x, u, i: lax.dynamic_update_slice(x, u, (i, np.int32(0))), [((5, 7), F32), ((2, 3), F32), ((), I32)]
    yield "pad", "edges", lambda x: lax.pad(x, np.float32(0), ((1, 2, 0), (0, 1, 0))), [((3, 4), F32)]
    yield "pad", "interior", lambda x: lax.pad(x, np.float32(-1), ((0, 0, 1), (1, 0, 2))), [((3, 4), F32)]
    yield "pad", "negative", lambda x: lax.pad(x, np.float32(0), ((-1, 1, 0), (2, -2, 0))), [((4, 5), F32)]
    yield "concatenate", "axis_1", lambda a, b: lax.concatenate([a, b], 1), [((3, 2), F32), ((3, 4), F32)]
    for dtype in (F32, I32):
        yield "iota", np.dtype(dtype).name, lambda x, d=dtype: x + lax.broadcasted_iota(d, (3, 4), 1), [((3, 4), dtype)]
    yield "rev", "axes_0_1", lambda x: lax.rev(x, (0, 1)), [((3, 4), F32)]

    import jax.numpy as jnp

    yield "gather", "take_axis_0", lambda x, i: jnp.take(x, i, axis=0), [((6, 4), F32), ((3,), I32, "positive")]
    yield "gather", "take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1), \
        [((3, 5), F32), ((3, 2), I32, "positive")]
    yield "gather", "batched", jax.vmap(lambda x, i: x[i]), [((2, 5, 3), F32), ((2,), I32, "positive")]
    yield "scatter", "set", lambda x, i, u: x.at[i].set(u), [((6, 3), F32), ((2,), I32, "positive"), ((2, 3), F32)]
    yield "scatter_add", "add", lambda x, i, u: x.at[i].add(u), [((6, 3), F32), ((4,), I32, "positive"),
                                                                 ((4, 3), F32)]
    yield "scatter_max", "max", lambda x, i, u: x.at[i].max(u), [((6, 3), F32), ((2,), I32, "positive"),
                                                                 ((2, 3), F32)]
    yield "sort", "ascending", lambda x: lax.sort(x, dimension=1), [((3, 6), F32)]
    yield "sort", "two_operands", lambda k, v: lax.sort((k, v), dimension=0, num_keys=1), [((5,), F32), ((5,), F32)]
    yield "top_k", "k_2", lambda x: lax.top_k(x, 2), [((3, 6), F32)]
    yield "while", "fori_loop", lambda x: lax.fori_loop(0, 4, lambda i, c: c * 0.5 + i, x), [((3,), F32)]
    yield "while", "data_dependent", lambda x: lax.while_loop(lambda c: c.sum() < 50.0, lambda c: c * 2 + 1, x), \
        [((3,), F32, "positive")]
    yield "scan", "cumulative", lambda x: lax.scan(lambda c, t: (c + t, c * t), np.zeros(3, np.float32), x), \
        [((5, 3), F32)]
    yield "cond", "two_branches", lambda p, x: lax.cond(p, lambda v: v * 2, lambda v: v - 1, x), [((), BOOL), ((4,), F32)]
    yield "switch", "three_branches", lambda i, x: lax.switch(i, [lambda v: v, lambda v: v * 3, jnp.sin], x), \
        [((), I32, "positive"), ((4,), F32)]


TOLERANCES = {np.dtype(F16): (2e-3, 2e-3)}


def collect_cases(ops: Sequence[str] | None = None) -> list:
    """The suite's cases (only those of ``ops``, primitive names as ``lax.add`` or ``add``)."""
    import jax

    from edgebuild.plugin import ConformanceCase, EdgebuildError, UsageError

    wanted = {op.removeprefix("lax.") for op in ops} if ops else None
    cases, known = [], set()
    for index, (primitive, variant, fn, specs) in enumerate(_variants()):
        known.add(primitive)
        if wanted is not None and primitive not in wanted:
            continue
        arrays = _arrays(index, *specs)
        name = f"lax_{primitive}_{variant}"
        dtype = np.dtype(specs[-1][1])
        rtol, atol = TOLERANCES.get(dtype, (1e-4, 1e-4))
        try:
            exported = _export(fn, arrays)
            expected = [np.asarray(v) for v in jax.tree_util.tree_leaves(exported.call(*arrays))]
        except Exception as exc:  # noqa: BLE001 - a case JAX itself cannot run is a bug of the suite
            raise RuntimeError(f"conformance case {name}: JAX failed: {exc}") from exc
        try:
            model, reason = _convert(exported), None
        except EdgebuildError as exc:
            model, reason = b"", " ".join(exc.message.split())
        cases.append(ConformanceCase(name, f"lax.{primitive}", model, arrays, expected, rtol, atol,
                                     reason=f"not converted: {reason}" if reason else None))
    if wanted is not None and wanted - known:
        raise UsageError(f"no stablehlo conformance cases for: {', '.join(sorted(wanted - known))}",
                         hint=f"primitives: {', '.join(sorted(known))}")
    return cases


def _export(fn, arrays):
    import jax
    from jax import export as jax_export

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    if not needs_x64(fn, arrays):
        return jax_export.export(jax.jit(fn))(*specs)
    with jax.enable_x64(True):
        return _X64Export(jax_export.export(jax.jit(fn))(*specs))


class _X64Export:
    """An export traced with 64-bit integers, which JAX runs only with x64 enabled too."""

    def __init__(self, exported):
        self._exported = exported

    def __getattr__(self, name):
        return getattr(self._exported, name)

    def call(self, *args):
        import jax

        with jax.enable_x64(True):
            return self._exported.call(*args)


def _convert(exported) -> bytes:
    import onnx_ir as ir

    from edgebuild_jax.convert.module import convert_module
    from edgebuild_jax.mlir import new_context, parse_module

    context = new_context()
    module = parse_module(bytes(exported.mlir_module_serialized), context, origin="case")
    with context:
        model = convert_module(module, origin="case")
    return ir.serde.serialize_model(model).SerializeToString()
