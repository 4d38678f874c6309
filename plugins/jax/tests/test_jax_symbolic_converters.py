"""Converters over symbolic dims: gather, dynamic_update_slice, dot_general contracting a
symbolic dim, convolution and dynamic_conv over symbolic spatial sizes, pad, reverse and
dynamic_slice of symbolically shaped operands. Each model is exported once, converted once, and
must match JAX at several concrete sizes (and in the Core ML lowering at the first)."""

from __future__ import annotations

import numpy as np
import pytest

from jax_checks import assert_converts_dynamic, jax, jnp

lax = jax.lax
RNG = np.random.default_rng(11)
TOL = dict(rtol=1e-4, atol=1e-4)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def specs(*templates, dtypes=None, constraints=()):
    """ShapeDtypeStructs for ``templates`` ("b, s", "k") whose symbols share one scope."""
    from jax import export as jax_export

    dims = jax_export.symbolic_shape(", ".join(templates), constraints=constraints)
    out, at = [], 0
    for index, template in enumerate(templates):
        rank = len(template.split(","))
        dtype = (dtypes or [np.float32] * len(templates))[index]
        out.append(jax.ShapeDtypeStruct(tuple(dims[at:at + rank]), dtype))
        at += rank
    return out


# -- gather ---------------------------------------------------------------------------------

TABLE = jnp.asarray(rand(20, 6))


@pytest.mark.parametrize("mode", ["fill", "clip", "wrap"])
def test_an_embedding_lookup_over_symbolic_batch_and_sequence(mode):
    def fn(ids):
        return jnp.take(TABLE, ids, axis=0, mode=mode)

    cases = [[RNG.integers(0, 20, (2, 3)).astype(np.int32)], [RNG.integers(-3, 24, (4, 7)).astype(np.int32)]]
    assert_converts_dynamic(fn, specs("b, s", dtypes=[np.int32]), cases, **TOL)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_along_each_axis_of_a_symbolic_operand(axis):
    def fn(x, i):
        return jnp.take(x, i, axis=axis, mode="clip")

    def case(b, s, k):
        x = rand(b, s, 3)
        return [x, RNG.integers(-1, x.shape[axis] + 1, (k,)).astype(np.int32)]

    assert_converts_dynamic(fn, specs("b, s, 3", "k", dtypes=[np.float32, np.int32]),
                            [case(2, 4, 3), case(5, 3, 6)], **TOL)


@pytest.mark.parametrize("axis", [0, 1])
def test_take_along_axis_with_symbolic_dims(axis):
    """take_along_axis writes a gather with batching dims (or an iota index) over the others."""
    def fn(x, i):
        return jnp.take_along_axis(x, i, axis=axis, mode="clip")

    def case(b, s):
        return [rand(b, s), RNG.integers(0, (b, s)[axis], (b, s)).astype(np.int32)]

    assert_converts_dynamic(fn, specs("b, s", "b, s", dtypes=[np.float32, np.int32]), [case(2, 3), case(4, 5)],
                            **TOL)


def test_points_picked_by_row_and_column_from_a_symbolic_matrix():
    def fn(x, rows, cols):
        return x[rows, cols]

    def case(b, s, k):
        return [rand(b, s), RNG.integers(0, b, (k,)).astype(np.int32), RNG.integers(0, s, (k,)).astype(np.int32)]

    assert_converts_dynamic(fn, specs("b, s", "k", "k", dtypes=[np.float32, np.int32, np.int32]),
                            [case(3, 4, 2), case(6, 2, 5)], **TOL)


def test_windows_gathered_at_run_time_starts_of_a_symbolic_operand():
    def fn(x, starts):
        return jax.vmap(lambda s: lax.dynamic_slice(x, (s, 1), (1, 2)))(starts)

    def case(b, k):
        return [rand(b, 3), RNG.integers(-1, b + 1, (k,)).astype(np.int32)]

    assert_converts_dynamic(fn, specs("b, 3", "k", dtypes=[np.float32, np.int32]), [case(4, 2), case(7, 5)],
                            **TOL)


# -- dynamic_update_slice -------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("start", [0, 1, 9, -4])
def test_an_update_spanning_a_symbolic_dim(axis, start):
    """The update's size along the symbolic dim is that dim; along the other, two columns."""
    def fn(x, i):
        update = (x[:, :2] if axis == 1 else x[:2, :]) * 2.0 + 1.0
        at = (0, i) if axis == 1 else (i, 0)
        return lax.dynamic_update_slice(x, update, at)

    index = np.asarray(start, np.int32)
    template = "b, 4" if axis == 1 else "4, b"
    cases = [[rand(3, 4) if axis == 1 else rand(4, 3), index], [rand(6, 4) if axis == 1 else rand(4, 6), index]]
    assert_converts_dynamic(fn, specs(template, "", dtypes=[np.float32, np.int32])[:1]
                            + [jax.ShapeDtypeStruct((), np.int32)], cases, **TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_a_fixed_size_update_into_a_symbolic_operand(dtype):
    def fn(x, i):
        return lax.dynamic_update_slice(x, jnp.ones((1, 3), x.dtype), (i, 0))

    for start in (0, 2, 40):
        index = np.asarray(start, np.int32)
        cases = [[(rand(3, 3) > 0).astype(dtype), index], [(rand(5, 3) > 0).astype(dtype), index]]
        assert_converts_dynamic(fn, [specs("b, 3", dtypes=[dtype])[0], jax.ShapeDtypeStruct((), np.int32)], cases)


def test_a_scan_stacking_outputs_over_a_symbolic_batch():
    def fn(x):
        def step(carry, row):
            carry = jnp.tanh(carry + row)
            return carry, carry * 2.0

        _, stacked = lax.scan(step, jnp.zeros((x.shape[0], 4), x.dtype), jnp.swapaxes(x, 0, 1))
        return stacked

    assert_converts_dynamic(fn, specs("b, 5, 4"), [[rand(2, 5, 4)], [rand(3, 5, 4)]], **TOL)


# -- dot_general over a symbolic contracting dim --------------------------------------------

@pytest.mark.parametrize("equation,templates", [
    ("bqk,bkd->bqd", ("b, q, k", "b, k, 8")),  # attention's weights @ V over a symbolic sequence
    ("bk,k->b", ("b, k", "k")),  # matrix-vector: no free rhs dim
    ("k,kd->d", ("k", "k, 3")),  # vector-matrix: no batch, no free lhs dim
    ("bij,bij->b", ("b, i, j", "b, i, j")),  # two symbolic dims contracted at once
    ("ki,kj->ij", ("k, i", "k, j")),  # contracted dim first, free dims symbolic too
])
def test_a_contraction_over_symbolic_dims(equation, templates):
    def fn(a, b):
        return jnp.einsum(equation, a, b)

    sizes = [{"b": 2, "q": 3, "k": 4, "i": 2, "j": 3}, {"b": 3, "q": 1, "k": 7, "i": 4, "j": 2}]

    def case(size):
        return [rand(*[size[d.strip()] if d.strip().isalpha() else int(d) for d in t.split(",")]) for t in templates]

    assert_converts_dynamic(fn, specs(*templates), [case(s) for s in sizes], **TOL)


# -- convolution over symbolic spatial dims -------------------------------------------------

KERNEL_2D = rand(3, 3, 2, 4) * 0.3


@pytest.mark.parametrize("numbers", [("NHWC", "HWIO", "NHWC"), ("NCHW", "OIHW", "NCHW")])
@pytest.mark.parametrize("strides,padding", [((1, 1), "SAME"), ((1, 1), "VALID"), ((2, 2), "SAME"),
                                             ((2, 1), "VALID"), ((1, 1), ((2, 1), (0, 2))),
                                             ((1, 2), ((-1, 1), (1, -1)))],
                         ids=["same", "valid", "same_strided", "valid_strided", "explicit", "negative"])
def test_a_2d_convolution_over_symbolic_height_and_width(numbers, strides, padding):
    kernel = KERNEL_2D if numbers[1] == "HWIO" else np.transpose(KERNEL_2D, (3, 2, 0, 1))

    def fn(x):
        return lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=numbers)

    template, shapes = ("b, h, w, 2", [(1, 7, 6, 2), (2, 9, 11, 2)]) if numbers[0] == "NHWC" \
        else ("b, 2, h, w", [(1, 2, 7, 6), (2, 2, 9, 11)])
    assert_converts_dynamic(fn, specs(template), [[rand(*s)] for s in shapes], **TOL)


@pytest.mark.parametrize("rhs_dilation,groups", [((2,), 1), ((1,), 2), ((3,), 4)],
                         ids=["dilated", "grouped", "depthwise_dilated"])
def test_a_1d_convolution_with_dilation_and_groups_over_a_symbolic_length(rhs_dilation, groups):
    kernel = rand(4, 4 // groups, 3) * 0.3

    def fn(x):
        return lax.conv_general_dilated(x, kernel, (1,), "SAME", rhs_dilation=rhs_dilation,
                                        feature_group_count=groups)

    assert_converts_dynamic(fn, specs("b, 4, s"), [[rand(1, 4, 9)], [rand(2, 4, 14)]], **TOL)


def test_a_3d_convolution_over_symbolic_depth():
    kernel = rand(2, 2, 2, 2, 3) * 0.3  # DHWIO

    def fn(x):
        return lax.conv_general_dilated(x, kernel, (1, 2, 1), "SAME", dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))

    assert_converts_dynamic(fn, specs("1, d, 5, 4, 2"), [[rand(1, 3, 5, 4, 2)], [rand(1, 6, 5, 4, 2)]], **TOL)


@pytest.mark.parametrize("computed_kernel", [False, True], ids=["constant_kernel", "computed_kernel"])
@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_a_transposed_convolution_over_symbolic_sizes(computed_kernel, strides):
    """lhs dilation: ConvTranspose for a constant kernel, zeros inserted at run time otherwise."""
    def fn(x, k):
        kernel = jnp.tanh(k) if computed_kernel else KERNEL_2D
        return lax.conv_transpose(x, kernel, strides, "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    k = KERNEL_2D
    assert_converts_dynamic(fn, specs("b, h, w, 2") + [jax.ShapeDtypeStruct(k.shape, np.float32)],
                            [[rand(1, 4, 5, 2), k], [rand(2, 6, 3, 2), k]], **TOL)


def test_a_convolution_over_symbolic_spatial_dims_keeps_its_static_kernel_size():
    from jax_checks import export, to_onnx

    def fn(x):
        return lax.conv_general_dilated(x, KERNEL_2D, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    model = to_onnx(export(fn, *specs("b, h, w, 2")))
    (conv,) = [n for n in model.graph.node if n.op_type == "Conv"]
    attrs = {a.name: list(a.ints) for a in conv.attribute}
    assert attrs["kernel_shape"] == [3, 3] and attrs["strides"] == [2, 2]
    assert "Pad" in [n.op_type for n in model.graph.node]  # SAME over an unknown size: padded at run time


# -- pad, reverse and dynamic_slice of symbolic operands -------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("config", [
    ((1, 2, 0), (0, 1, 0)),  # edges
    ((0, 0, 1), (2, 0, 2)),  # interior, on each dim
    ((-1, 2, 1), (1, -2, 0)),  # negative edges crop
], ids=["edges", "interior", "negative"])
def test_pad_of_a_symbolic_operand(dtype, config):
    def fn(x):
        return lax.pad(x, jnp.asarray(3, x.dtype), config)

    cases = [[(rand(3, 4) * 5).astype(dtype)], [(rand(5, 2) * 5).astype(dtype)]]
    assert_converts_dynamic(fn, specs("b, s", dtypes=[dtype]), cases)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_numpy_pad_modes_of_a_symbolic_operand(mode):
    def fn(x):
        return jnp.pad(x, ((1, 2), (2, 1)), mode=mode)

    assert_converts_dynamic(fn, specs("b, s", constraints=["b >= 3", "s >= 3"]), [[rand(3, 4)], [rand(5, 3)]])


@pytest.mark.parametrize("axes", [(0,), (1,), (0, 1)])
def test_reverse_along_symbolic_dims(axes):
    assert_converts_dynamic(lambda x: jnp.flip(x, axes), specs("b, s"), [[rand(3, 4)], [rand(5, 2)]])


@pytest.mark.parametrize("start", [0, 2, 50, -3])
@pytest.mark.parametrize("axis", [0, 1])
def test_a_fixed_size_slice_at_a_run_time_start_of_a_symbolic_operand(start, axis):
    def fn(x, i):
        return lax.dynamic_slice_in_dim(x, i, 2, axis=axis)

    index = np.asarray(start, np.int32)
    assert_converts_dynamic(fn, [specs("b, s", constraints=["b >= 2", "s >= 2"])[0],
                                 jax.ShapeDtypeStruct((), np.int32)], [[rand(3, 4), index], [rand(6, 5), index]])


# -- scatter --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_a_column_set_across_a_symbolic_batch(dtype):
    def fn(x):
        return x.at[:, 1].set(jnp.ones((), x.dtype))

    cases = [[(rand(3, 4) > 0).astype(dtype)], [(rand(6, 4) * 4).astype(dtype)]]
    assert_converts_dynamic(fn, specs("b, 4", dtypes=[dtype]), cases)


@pytest.mark.parametrize("update", ["set", "add", "max", "mul"])
@pytest.mark.parametrize("start", [0, 2, -1, 30])
def test_a_row_updated_at_a_run_time_index_of_a_symbolic_operand(update, start):
    """Out-of-range rows are dropped, as JAX's default scatter mode says; negative ones count
    from the end."""
    def fn(x, i):
        return getattr(x.at[i], update)(jnp.arange(4.0) - 1.5)

    index = np.asarray(start, np.int32)
    assert_converts_dynamic(fn, [specs("b, 4")[0], jax.ShapeDtypeStruct((), np.int32)],
                            [[rand(3, 4), index], [rand(5, 4), index]])


def test_rows_scattered_at_a_symbolic_count_of_indices():
    def fn(x, rows, values):
        return x.at[rows].add(values)

    def case(b, k):
        return [rand(b, 3), RNG.integers(-b, b + 2, (k,)).astype(np.int32), rand(k, 3)]

    assert_converts_dynamic(fn, specs("b, 3", "k", "k, 3", dtypes=[np.float32, np.int32, np.float32]),
                            [case(4, 2), case(6, 5)], **TOL)


def test_a_per_row_scatter_over_a_symbolic_batch():
    """vmap of a scatter: the batch is a batching dim of operand and indices."""
    def fn(x, at, values):
        return jax.vmap(lambda row, i, v: row.at[i].set(v))(x, at, values)

    def case(b):
        return [rand(b, 5), RNG.integers(0, 5, (b,)).astype(np.int32), rand(b)]

    assert_converts_dynamic(fn, specs("b, 5", "b", "b", dtypes=[np.float32, np.int32, np.float32]),
                            [case(2), case(4)])
