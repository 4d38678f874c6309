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


@pytest.mark.parametrize("traced", ["upper", "lower"])
def test_fori_loop_with_traced_bounds(traced):
    def fn(x, n):
        lower, upper = (0, n) if traced == "upper" else (n, 4)
        return lax.fori_loop(lower, upper, lambda i, a: a * 0.5 + i.astype(a.dtype), x)
    for n in (-2, 0, 1, 4, 6):
        # a traced lower bound makes the counter a rank-0 graph input carried through the Loop
        model = assert_converts(fn, X, np.int32(n), lowered_tol=(1e-3, 1e-3))
        assert _loops(model)[0].input[1] != ""  # a runtime bound: the condition ends the loop


def _loops(model):
    return [n for n in model.graph.node if n.op_type == "Loop"]


@pytest.mark.parametrize("lower,upper", [(2, 7), (0, 1), (-3, 2), (3, 12)])
def test_counted_loop_gets_its_trip_count(lower, upper):
    model = assert_converts(lambda x: lax.fori_loop(lower, upper, lambda i, a: a * 0.5 + i.astype(a.dtype), x), X,
                            lowered_tol=(1e-3, 1e-3))
    (loop,) = _loops(model)
    assert loop.input[0] != "" and loop.input[1] == ""


@pytest.mark.parametrize("limit", [0.5, 3.0, 40.0])
def test_while_loop_with_data_dependent_condition(limit):
    def fn(x):
        return lax.while_loop(lambda c: jnp.sum(c[0]) < limit, lambda c: (c[0] * 1.5 + 0.1, c[1] + 1),
                              (jnp.abs(x), jnp.int32(0)))
    model = assert_converts(fn, X, rtol=1e-5, atol=1e-5, lowered_tol=(1e-3, 1e-3))
    assert _loops(model)[0].input[1] != ""


def test_while_loop_whose_first_condition_is_a_constant():
    # the initial condition is a constant and the next one is not: the loop still runs to the data
    fn = lambda x: lax.while_loop(lambda c: c[1] < 10.0, lambda c: (c[0] * 1.5, c[1] * 2.0),
                                  (x, jnp.float32(1.0)))
    assert_converts(fn, X, lowered_tol=(1e-3, 1e-3))


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


@pytest.mark.parametrize("flag", [True, False])
def test_cond_runs_the_chosen_branch(flag):
    fn = lambda p, x: lax.cond(p, lambda a: (jnp.sin(a), a.sum()), lambda a: (a * 2.0, a.max()), x)
    assert_converts(fn, np.bool_(flag), X, lowered_tol=(1e-3, 1e-3))


@pytest.mark.parametrize("index", [-3, 0, 1, 2, 3, 7])
def test_switch_with_three_branches_clamps_its_index(index):
    branches = [lambda a: a + 1.0, lambda a: jnp.exp(a), lambda a: a * a]
    fn = lambda i, x: lax.switch(i, branches, x)
    model = assert_converts(fn, np.int32(index), X, lowered_tol=(1e-3, 1e-3))
    assert any(n.op_type == "If" for n in model.graph.node)


def test_case_with_a_raw_index_out_of_range_runs_the_last_branch():
    text = """
    func.func @main(%i: tensor<i32>, %x: tensor<2xf32>) -> tensor<2xf32> {
      %r = "stablehlo.case"(%i) ({
        %a = stablehlo.add %x, %x : tensor<2xf32>
        stablehlo.return %a : tensor<2xf32>
      }, {
        %m = stablehlo.multiply %x, %x : tensor<2xf32>
        stablehlo.return %m : tensor<2xf32>
      }, {
        %n = stablehlo.negate %x : tensor<2xf32>
        stablehlo.return %n : tensor<2xf32>
      }) : (tensor<i32>) -> tensor<2xf32>
      return %r : tensor<2xf32>
    }
    """
    model = _convert_text(text)
    from jax_checks import run_lowered, run_onnxruntime

    x = np.asarray([1.5, -2.0], np.float32)
    for index, want in [(0, x + x), (1, x * x), (2, -x), (5, -x), (-1, -x)]:
        for run, tol in ((run_onnxruntime, 1e-6), (run_lowered, 1e-3)):
            (got,) = run(model, [np.asarray(index, np.int32), x])
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_optimization_barrier_passes_its_operands():
    fn = lambda x, y: lax.optimization_barrier((x * 2.0, y + 1.0))
    assert_converts(fn, X, X.T.copy())


def _convert_text(text, origin="model.mlir"):
    import onnx_ir as ir

    from edgebuild_jax.convert.module import convert_module
    from edgebuild_jax.mlir import new_context, parse_module

    context = new_context()
    module = parse_module(text.encode(), context, origin=origin)
    with context:
        return ir.serde.serialize_model(convert_module(module, origin=origin))


@pytest.mark.parametrize("inside_loop", [False, True])
def test_custom_call_is_refused_naming_its_target_and_line(inside_loop):
    from edgebuild.plugin import BuildError

    call = ('%c = stablehlo.custom_call @my_kernel(%x) : (tensor<4xf32>) -> tensor<4xf32> '
            'loc("f"("model.py":17:3))')
    if inside_loop:
        body = f"""
      %z = stablehlo.constant dense<0> : tensor<i32>
      %r:2 = stablehlo.while(%k = %z, %x = %x0) : tensor<i32>, tensor<4xf32>
        cond {{
          %n = stablehlo.constant dense<3> : tensor<i32>
          %p = stablehlo.compare LT, %k, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
          stablehlo.return %p : tensor<i1>
        }} do {{
          {call}
          %one = stablehlo.constant dense<1> : tensor<i32>
          %k1 = stablehlo.add %k, %one : tensor<i32>
          stablehlo.return %k1, %c : tensor<i32>, tensor<4xf32>
        }}
      return %r#1 : tensor<4xf32>"""
    else:
        body = f"""
      %x = stablehlo.abs %x0 : tensor<4xf32>
      {call}
      return %c : tensor<4xf32>"""
    text = f"func.func @main(%x0: tensor<4xf32>) -> tensor<4xf32> {{{body}\n}}"
    with pytest.raises(BuildError) as raised:
        _convert_text(text)
    message = str(raised.value)
    assert "my_kernel" in message and "model.py:17" in message and "stablehlo.custom_call" in message


@pytest.mark.parametrize("flag", [True, False])
def test_stablehlo_if_from_text(flag):
    from jax_checks import run_lowered, run_onnxruntime

    text = """
    func.func @main(%p: tensor<i1>, %x: tensor<3xf32>) -> (tensor<3xf32>, tensor<f32>) {
      %r:2 = "stablehlo.if"(%p) ({
        %e = stablehlo.exponential %x : tensor<3xf32>
        %c = stablehlo.constant dense<1.0> : tensor<f32>
        stablehlo.return %e, %c : tensor<3xf32>, tensor<f32>
      }, {
        %n = stablehlo.negate %x : tensor<3xf32>
        %c = stablehlo.constant dense<2.0> : tensor<f32>
        stablehlo.return %n, %c : tensor<3xf32>, tensor<f32>
      }) : (tensor<i1>) -> (tensor<3xf32>, tensor<f32>)
      return %r#0, %r#1 : tensor<3xf32>, tensor<f32>
    }
    """
    model = _convert_text(text)
    assert [n.op_type for n in model.graph.node if n.op_type == "If"] == ["If"]
    x = np.asarray([0.5, -1.0, 2.0], np.float32)
    want = (np.exp(x), 1.0) if flag else (-x, 2.0)
    for run, tol in ((run_onnxruntime, 1e-6), (run_lowered, 1e-3)):
        got = run(model, [np.asarray(flag), x])
        np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol)
        np.testing.assert_allclose(got[1], want[1], rtol=tol, atol=tol)


def test_float_counter_is_not_taken_for_a_counted_loop():
    # 0.25, 1.25, 2.25 run: three iterations, not int(2.5) - int(0.25)
    fn = lambda x: lax.while_loop(lambda c: c[1] < 2.5, lambda c: (c[0] + c[1], c[1] + 1.0), (x, jnp.float32(0.25)))
    model = assert_converts(fn, X, lowered_tol=(1e-3, 1e-3))  # a constant first condition, as above
    assert _loops(model)[0].input[1] != ""


def test_cond_inside_a_loop_body_on_the_counter():
    def fn(x):
        step = lambda i, a: lax.cond(i % 2 == 0, lambda b: b + 1.0, lambda b: b * 0.5, a)
        return lax.fori_loop(0, 5, step, x)
    assert_converts(fn, X, lowered_tol=(1e-3, 1e-3))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_switch_with_several_outputs_and_a_captured_value(index):
    bias = RNG.standard_normal((3, 4)).astype(np.float32)

    def fn(i, x, b):
        branches = [lambda a: (a + b, jnp.sum(a)), lambda a: (a - b, jnp.max(a)), lambda a: (a * b, jnp.min(a))]
        return lax.switch(i, branches, x)
    assert_converts(fn, np.int32(index), X, bias, lowered_tol=(1e-3, 1e-3))
