import numpy as np
import pytest

from jax_checks import assert_converts, export, jax, jnp, to_onnx

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4)).astype(np.float32)
lax = jax.lax


def _converts(*ops):
    from edgebuild_jax.convert.registry import supported_ops

    return all(o in supported_ops() for o in ops)


# scan reads xs with dynamic_slice and writes stacked ys with dynamic_update_slice (the indexing family)
needs_slicing = pytest.mark.skipif(not _converts("stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice"),
                                   reason="the dynamic_slice converters are not available")


def test_fori_loop_with_constant_bounds():
    assert_converts(lambda x: lax.fori_loop(0, 5, lambda i, a: a * 0.9 + i.astype(a.dtype), x), X,
                    rtol=1e-5, atol=1e-5, lowered_tol=(1e-3, 1e-3))


def test_fori_loop_with_traced_bounds():
    fn = lambda x, n: lax.fori_loop(0, n, lambda i, a: a + i.astype(a.dtype), x)
    for n in (0, 1, 4):
        assert_converts(fn, X, np.int32(n), lowered_tol=(1e-3, 1e-3))


def _loops(model):
    return [n for n in model.graph.node if n.op_type == "Loop"]


def test_counted_loop_gets_its_trip_count():
    model = assert_converts(lambda x: lax.fori_loop(2, 7, lambda i, a: a + 1.0, x), X)
    (loop,) = _loops(model)
    assert loop.input[0] != "" and loop.input[1] == ""


@pytest.mark.parametrize("limit", [0.5, 3.0, 40.0])
def test_while_loop_with_data_dependent_condition(limit):
    def fn(x):
        return lax.while_loop(lambda c: jnp.sum(c[0]) < limit, lambda c: (c[0] * 1.5 + 0.1, c[1] + 1),
                              (jnp.abs(x), jnp.int32(0)))
    model = assert_converts(fn, X, rtol=1e-5, atol=1e-5, lowered_tol=(1e-3, 1e-3))
    assert _loops(model)[0].input[1] != ""


@needs_slicing
@pytest.mark.parametrize("axis_len", [1, 5])
def test_scan_cumulative_sum(axis_len):
    xs = RNG.standard_normal((axis_len, 3)).astype(np.float32)
    fn = lambda xs: lax.scan(lambda c, x: (c + x, c + x), jnp.zeros(3, jnp.float32), xs)
    assert_converts(fn, xs, lowered_tol=(1e-4, 1e-4))


@needs_slicing
@pytest.mark.parametrize("steps,hidden", [(4, 3), (6, 5)])
def test_scan_rnn_cell_with_stacked_outputs(steps, hidden):
    xs = RNG.standard_normal((steps, 2, 4)).astype(np.float32)
    w = RNG.standard_normal((4, hidden)).astype(np.float32) * 0.5
    u = RNG.standard_normal((hidden, hidden)).astype(np.float32) * 0.5

    def fn(xs, w, u):
        def cell(h, x):
            h = jnp.tanh(x @ w + h @ u)
            return h, h
        return lax.scan(cell, jnp.zeros((2, hidden), jnp.float32), xs)
    assert_converts(fn, xs, w, u, rtol=1e-4, atol=1e-5, lowered_tol=(1e-3, 1e-3))


def test_scan_over_a_length_with_a_carry_only():
    fn = lambda x: lax.scan(lambda c, _: (jnp.tanh(c * 1.1 + 0.2), None), x, None, length=6)[0]
    model = assert_converts(fn, X, lowered_tol=(1e-3, 1e-3))
    assert _loops(model)[0].input[0] != ""


def test_nested_loops():
    def fn(x):
        def outer(i, a):
            return lax.fori_loop(0, i + 1, lambda j, b: b * 0.5 + j.astype(b.dtype), a)
        return lax.fori_loop(0, 3, outer, x)
    assert_converts(fn, X, lowered_tol=(1e-3, 1e-3))


def test_function_call_inside_loop_body():
    @jax.jit
    def step(a):
        return jnp.sin(a) + a

    fn = lambda x: lax.fori_loop(0, 3, lambda i, a: step(a), x)
    exported = export(fn, X)
    assert "call @" in exported.mlir_module()
    assert_converts(fn, X, lowered_tol=(1e-3, 1e-3))
