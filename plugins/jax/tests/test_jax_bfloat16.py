"""bfloat16 modules: their values carried as float32, arithmetic in float32, a convert to bfloat16
rounding exactly as bfloat16 does; checked on onnxruntime and the Core ML lowering against JAX."""

import json

import ml_dtypes
import numpy as np
import pytest

from jax_checks import export, jax, jnp, run_lowered, run_onnxruntime, to_onnx
from test_jax_recipes import run

BF16 = jnp.bfloat16
RNG = np.random.default_rng(7)
ULP = 2.0 ** -7  # bfloat16's relative spacing: JAX rounds each op's result, the graph does not


def _as_fed(array):
    array = np.asarray(array)
    return array.astype(np.float32) if array.dtype == ml_dtypes.bfloat16 else array


def check(fn, *arrays, ops=1, exact=False):
    """``fn`` on ``arrays`` (bf16 arrays allowed) against JAX: bit for bit where ``exact``, else within
    the bfloat16 rounding of ``ops`` results (JAX rounds every intermediate, the graph none)."""
    exported = export(fn, *arrays)
    want = [np.asarray(w) for w in jax.tree_util.tree_leaves(exported.call(*arrays))]
    model = to_onnx(exported)
    fed = [_as_fed(a) for a in arrays]
    for what, got in (("onnxruntime", run_onnxruntime(model, fed)), ("lowered", run_lowered(model, fed))):
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.shape == w.shape, what
            if w.dtype.kind in "biu":
                np.testing.assert_array_equal(g.astype(w.dtype), w, err_msg=what)
            elif exact:
                np.testing.assert_array_equal(g.astype(np.float32), w.astype(np.float32), err_msg=what)
            else:
                w64 = w.astype(np.float64)
                tolerance = 2 * ops * ULP * np.maximum(np.abs(w64), np.abs(w64).max() * ULP) + 1e-30
                assert np.all(np.abs(g.astype(np.float64) - w64) <= tolerance), (what, np.abs(g - w64).max())
    return model


def bf16(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def test_no_bfloat16_reaches_the_graph():
    model = check(lambda x, y: (x * y + 1).astype(jnp.float32), bf16(3, 4), bf16(3, 4), ops=2)
    types = {v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]}
    types |= {t.data_type for t in model.graph.initializer}
    assert 16 not in types  # TensorProto.BFLOAT16
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [1, 1]  # carried as float32


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "logistic", "sqrt", "rsqrt", "abs", "neg", "floor", "ceil",
                                  "sin", "cos", "erf", "sign", "round"])
def test_unary_ops(name):
    fn = {"log": lambda x: jnp.log(x), "sqrt": jnp.sqrt, "rsqrt": jax.lax.rsqrt}.get(name) or getattr(jax.lax, name)
    low = 0.1 if name in ("log", "sqrt", "rsqrt") else -3.0
    exact = name in ("abs", "neg", "floor", "ceil", "sign", "round")
    check(fn, bf16(4, 5, low=low, high=3.0), exact=exact)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "max", "min", "pow", "atan2", "rem"])
def test_binary_ops(name):
    b = bf16(3, 6, low=0.5, high=2.0) if name in ("div", "pow", "rem") else bf16(3, 6)
    check(getattr(jax.lax, name), bf16(3, 6, low=0.1 if name == "pow" else -2.0), b, exact=name in ("max", "min"))


@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_comparisons_and_select_are_exact(direction):
    a, b = bf16(4, 4), bf16(4, 4)
    b[0] = a[0]  # ties: bf16 values compare as the float32 they are carried in
    compare = {"EQ": jnp.equal, "NE": jnp.not_equal, "LT": jnp.less, "LE": jnp.less_equal, "GT": jnp.greater,
               "GE": jnp.greater_equal}[direction]
    check(lambda x, y: (compare(x, y), jnp.where(compare(x, y), x, y)), a, b, exact=True)


@pytest.mark.parametrize("preferred", [None, jnp.float32])
@pytest.mark.parametrize("batched", [False, True])
def test_dot_general(preferred, batched):
    lhs, rhs = (bf16(2, 3, 8), bf16(2, 8, 5)) if batched else (bf16(3, 8), bf16(8, 5))
    dims = (((2,), (1,)), ((0,), (0,))) if batched else (((1,), (0,)), ((), ()))
    check(lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=preferred), lhs, rhs, ops=2)


def test_convolution():
    check(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME"), bf16(1, 3, 8, 8), bf16(4, 3, 3, 3), ops=2)


@pytest.mark.parametrize("reduce", ["sum", "max", "min", "argmax", "mean"])
def test_reductions(reduce):
    fn = {"sum": lambda x: x.sum(axis=1), "max": lambda x: x.max(axis=(0, 2)), "min": lambda x: x.min(axis=-1),
          "argmax": lambda x: jnp.argmax(x, axis=1), "mean": lambda x: x.mean(axis=1)}[reduce]
    check(fn, bf16(3, 16, 4, low=0.0, high=2.0), exact=reduce in ("max", "min", "argmax"), ops=4)


def _round_trip_values():
    """float32 values at every kind of bfloat16 rounding: exact ties (to even), random ones of
    every scale, subnormals, values that round to infinity, inf and NaN."""
    bits = np.arange(0x3F80, 0x3FA0, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    ties = ((bits[:-1] + bits[1:]) / 2).astype(np.float32)
    scales = 10.0 ** RNG.uniform(-38, 38, size=400)
    edges = [0.0, -0.0, 1e-40, -3e-41, 1e-45, 3.3e38, 3.3961e38, -3.4e38, np.inf, -np.inf, np.nan]
    return np.concatenate([ties, -ties, (RNG.standard_normal(400) * scales).astype(np.float32),
                           np.asarray(edges, np.float32)])


def test_a_convert_to_bfloat16_rounds_bit_for_bit():
    x = _round_trip_values()
    model = check(lambda v: v.astype(BF16).astype(jnp.float32), x, exact=True)
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = run_lowered(model, [x])[0]
    same = (got == expected) | (np.isnan(got) & np.isnan(expected))
    assert same.all(), x[~same]


@pytest.mark.parametrize("source", [np.int32, np.int8, np.float16, np.bool_, np.float32])
def test_converts_from_every_type_round_once(source):
    if source == np.bool_:
        x = RNG.integers(0, 2, size=20).astype(bool)
    elif source == np.float16:
        x = RNG.standard_normal(20).astype(np.float16) * np.float16(30)
    elif np.dtype(source).kind == "i":
        info = np.iinfo(source)
        x = RNG.integers(info.min, info.max, size=20).astype(source)
    else:
        x = RNG.standard_normal(20).astype(np.float32) * 1e3
    check(lambda v: v.astype(BF16).astype(jnp.float32), x, exact=True)


@pytest.mark.parametrize("target", [jnp.int32, jnp.int8, jnp.float16, jnp.bool_])
def test_converts_from_bfloat16(target):
    check(lambda v: v.astype(target), bf16(20, low=-100.0, high=100.0), exact=True)


@pytest.mark.parametrize("size", [1, 6, 4096])
def test_bfloat16_constants_splat_dense_and_large(size):
    values = bf16(size, low=-5.0, high=5.0)
    check(lambda x: x * jnp.asarray(values), bf16(size), ops=1)
    check(lambda x: x + jnp.full((size,), 0.1, BF16), bf16(size), ops=1)


def test_a_bfloat16_model_builds_and_validates_against_jax(tmp_path):
    """A Flax encoder block computing in bfloat16 (float32 parameters cast at use), with bfloat16
    inputs and outputs: built at float32 and float16 and validated against JAX."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm(dtype=BF16)(x)
            h = nn.SelfAttention(num_heads=2, dtype=BF16)(h)
            x = x + h
            return x + nn.Dense(16, dtype=BF16)(nn.gelu(nn.Dense(32, dtype=BF16)(nn.LayerNorm(dtype=BF16)(x))))

    model = Block()
    x = bf16(2, 6, 16)
    params = model.init(jax.random.key(0), x)
    exported = export(lambda v: model.apply(params, v), x)
    (tmp_path / "block.jaxexport").write_bytes(bytes(exported.serialize()))
    cosines = {}
    for precision in ("float32", "float16"):
        recipe = tmp_path / f"{precision}.yaml"
        recipe.write_text(f"""edgebuild: 1
name: block
source: {{model: block.jaxexport}}
target: {{backend: coreml, precision: {precision}}}
validate:
  samples: 2
  thresholds: {{cosine_min: 0.999}}
outputs: {{dir: {precision}}}
""")
        code, result = run(recipe, tmp_path / "cache")
        (variant,) = result["variants"]
        assert code == 0 and variant["status"] == "built", variant
        report = json.loads((tmp_path / precision / "default" / "report.json").read_text())
        metrics = report["validation"]["runtimes"]["interpreter"]["metrics"]
        cosines[precision] = min(output["cosine"]["min"] for output in metrics.values())
    assert cosines["float32"] >= 0.9995 and cosines["float16"] >= 0.999, cosines
