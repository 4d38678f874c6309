"""Shape-polymorphic exports: symbolic batch and sequence dims stay dynamic in the ONNX graph,
which must match JAX at several concrete sizes."""

from __future__ import annotations

import numpy as np
import pytest

from jax_checks import assert_converts_dynamic, export, jax, jnp, symbolic, to_onnx

RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def each_size(template: str, sizes, dtype=np.float32):
    """Arrays for ``template`` ("b, 16") with its symbolic dims set to each of ``sizes``."""
    cases = []
    for size in sizes:
        dims = [size if d.strip().isalpha() else int(d) for d in template.split(",")]
        cases.append([rand(*dims).astype(dtype)])
    return cases


W1, B1, W2 = rand(16, 32), rand(32), rand(32, 8)


def mlp(x):
    return jax.nn.relu(x @ W1 + B1) @ W2


@pytest.mark.parametrize("template", ["b, 16", "b, s, 16"])
def test_mlp_with_symbolic_batch_and_sequence(template):
    model = assert_converts_dynamic(mlp, [symbolic(template)], each_size(template, [3, 5]), rtol=1e-4, atol=1e-4)
    names = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim if d.dim_param]
    assert names == [f"input_0_dim{axis}" for axis in range(len(names))]


KERNEL = rand(3, 3, 2, 4)


def conv_net(x):
    y = jax.lax.conv_general_dilated(x, KERNEL, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y)
    return jnp.mean(y, axis=(1, 2))


def test_conv_net_with_symbolic_batch():
    assert_converts_dynamic(conv_net, [symbolic("b, 8, 8, 2")], each_size("b, 8, 8, 2", [2, 3]),
                            rtol=1e-4, atol=1e-4)


def layer_norm(x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5)


@pytest.mark.parametrize("fn", [lambda x: jax.nn.softmax(x, axis=-1), lambda x: jax.nn.softmax(x, axis=0),
                                layer_norm], ids=["softmax_last", "softmax_symbolic_axis", "layer_norm"])
@pytest.mark.parametrize("template", ["b, 6", "b, s"])
def test_normalisations(fn, template):
    cases = [[rand(2, 6 if "6" in template else 3)], [rand(5, 6 if "6" in template else 7)]]
    assert_converts_dynamic(fn, [symbolic(template)], cases, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn,template", [
    (lambda x: x.reshape(-1), "b, 4"),
    (lambda x: x.reshape(x.shape[0] * x.shape[1], 3), "b, s, 3"),
    (lambda x: x.reshape(x.shape[0], -1), "b, 2, 3"),
    (lambda x: x.reshape(x.shape[0] // 2, 2, 4), "b, 4"),
], ids=["flatten", "merge_two_symbolic", "merge_static_into_batch", "split_batch"])
def test_reshape_with_symbolic_dims(fn, template):
    dims = lambda n: [n if d.strip().isalpha() else int(d) for d in template.split(",")]
    assert_converts_dynamic(fn, [symbolic(template)], [[rand(*dims(2))], [rand(*dims(6))]])


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float32])
@pytest.mark.parametrize("axis", [0, 1])
def test_arange_of_a_symbolic_size(dtype, axis):
    def fn(x):
        return x + jnp.arange(x.shape[axis], dtype=dtype)[:, None] if axis == 0 \
            else x + jnp.arange(x.shape[axis], dtype=dtype)[None, :]

    cases = [[rand(3, 4).astype(dtype)], [rand(5, 6).astype(dtype)]]
    assert_converts_dynamic(fn, [symbolic("b, s", dtype)], cases)


def test_arange_alone():
    assert_converts_dynamic(lambda x: jnp.arange(x.shape[0]), [symbolic("b, 4")], each_size("b, 4", [3, 7]),
                            lowered=False)  # an output with no float input: checked on onnxruntime


@pytest.mark.parametrize("fn", [
    lambda x: x[: x.shape[0] // 2],
    lambda x: x[1:],
    lambda x: x[:, : x.shape[1] - 1],
    lambda x: x[x.shape[0] // 2:, 1:3],
], ids=["first_half", "drop_first", "drop_last_of_seq", "second_half_window"])
def test_slices_by_symbolic_sizes(fn):
    assert_converts_dynamic(fn, [symbolic("b, s")], [[rand(4, 5)], [rand(7, 6)]])


@pytest.mark.parametrize("axis", [0, 1])
def test_concatenation_along_a_symbolic_dim(axis):
    def fn(x, y):
        return jnp.concatenate([x, y, x], axis=axis)

    shape = jax.export.symbolic_shape("b, s")  # one scope: both inputs share b and s
    specs = [jax.ShapeDtypeStruct(shape, jnp.float32)] * 2
    assert_converts_dynamic(fn, specs, [[rand(2, 3), rand(2, 3)], [rand(5, 4), rand(5, 4)]])


@pytest.mark.parametrize("widths", [lambda n: ((0, 0, 0), (1, n, 0)), lambda n: ((n, 1, 0), (0, 0, 0)),
                                    lambda n: ((0, 0, 0), (n, -1, 0))], ids=["high", "low", "crop"])
def test_pad_by_a_symbolic_amount(widths):
    def fn(x):
        return jax.lax.pad(x, jnp.float32(0.5), widths(x.shape[0]))

    assert_converts_dynamic(fn, [symbolic("b, 3")], [[rand(2, 3)], [rand(4, 3)]])


def test_shape_assertions_are_not_in_the_graph():
    model = to_onnx(export(mlp, symbolic("b, 16")))
    assert not any(n.op_type in ("If", "Assert") for n in model.graph.node)
    assert not model.graph.output[0].type.tensor_type.shape.dim[0].HasField("dim_value")


@pytest.mark.parametrize("start", [0, 1, 3, -2, 100])
def test_dynamic_slice_of_a_symbolic_size(start):
    """A run-time start and a symbolic size: a real_dynamic_slice whose start jax clamps."""
    def fn(x, i):
        return jax.lax.dynamic_slice(x, (i, 0), (x.shape[0] // 2, 3))

    specs = [symbolic("b, 3"), jax.ShapeDtypeStruct((), jnp.int32)]
    index = np.asarray(start, np.int32)
    assert_converts_dynamic(fn, specs, [[rand(4, 3), index], [rand(7, 3), index]], lowered=False)


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.bool_])
def test_broadcast_and_reshape_of_other_dtypes(dtype):
    def fn(x):
        y = jnp.broadcast_to(x[:, None, :], (x.shape[0], 2, x.shape[1]))
        return y.reshape(x.shape[0], -1)

    cases = [[(rand(2, 3) > 0).astype(dtype)], [(rand(4, 5) * 3).astype(dtype)]]
    assert_converts_dynamic(fn, [symbolic("b, s", dtype)], cases, lowered=True)


def test_interior_dynamic_padding_is_refused():
    from edgebuild.plugin import BuildError

    def fn(x):
        return jax.lax.pad(x, jnp.float32(0), ((0, x.shape[0], 1), (0, 0, 0)))

    with pytest.raises(BuildError, match="interior padding"):
        to_onnx(export(fn, symbolic("b, 3")))


@pytest.mark.parametrize("dimension", [0, 1, 2])
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float32])
def test_broadcasted_iota_over_symbolic_dims(dimension, dtype):
    def fn(x):
        iota = jax.lax.broadcasted_iota(dtype, (x.shape[0], 3, x.shape[1]), dimension)
        return x[:, None, :].astype(dtype) + iota

    assert_converts_dynamic(fn, [symbolic("b, s")], [[rand(2, 4)], [rand(5, 3)]])


@pytest.mark.parametrize("fn", [
    lambda x: x[-1],
    lambda x: jax.lax.dynamic_index_in_dim(x, x.shape[1] // 2, axis=1, keepdims=False),
    lambda x: jax.lax.dynamic_index_in_dim(x, x.shape[0] - 2, axis=0)[:, 1:],
], ids=["last_row", "middle_column", "row_tail"])
def test_indexing_at_a_symbolic_position(fn):
    assert_converts_dynamic(fn, [symbolic("b, s")], [[rand(3, 4)], [rand(6, 5)]])


def attention(x):
    q, k, v = x @ W_Q, x @ W_K, x @ W_V
    scores = jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(8.0)
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v)


W_Q, W_K, W_V = rand(8, 8), rand(8, 8), rand(8, 8)


def attention_scores(x):
    q, k = x @ W_Q, x @ W_K
    return jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / np.sqrt(8.0), axis=-1)


@pytest.mark.parametrize("fn,template,sizes", [
    (attention, "b, 5, 8", [(2, 5, 8), (3, 5, 8)]),
    (attention_scores, "b, s, 8", [(2, 3, 8), (1, 6, 8)]),
], ids=["attention_symbolic_batch", "scores_symbolic_sequence"])
def test_attention_with_symbolic_dims(fn, template, sizes):
    assert_converts_dynamic(fn, [symbolic(template)], [[rand(*size)] for size in sizes], rtol=1e-4, atol=1e-4)


def test_flax_residual_cnn_with_a_symbolic_batch():
    """The Flax CNN of test_jax_architectures, exported once for any batch size."""
    import test_jax_architectures as arch

    fn = arch.bound(arch.ResidualCNN(), rand(1, 16, 16, 3))
    assert_converts_dynamic(fn, [symbolic("b, 16, 16, 3")], [[rand(2, 16, 16, 3)], [rand(3, 16, 16, 3)]],
                            rtol=1e-4, atol=1e-4, lowered_tol=(2e-3, 2e-3))
