import numpy as np
import pytest

from jax_checks import assert_converts, jax, jnp, onnx_from_mlir

lax = jax.lax
RNG = np.random.default_rng(0)


def normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


TOL = dict(rtol=1e-4, atol=1e-4, lowered_tol=(1e-3, 1e-3))

EINSUMS = [
    ("ij,jk->ik", (3, 4), (4, 5)),
    ("ij,kj->ik", (3, 4), (5, 4)),
    ("ji,jk->ki", (4, 3), (4, 5)),
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
    ("ibj,jbk->bki", (3, 2, 4), (4, 2, 5)),
    ("bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5)),
    ("abcd,cdef->abef", (2, 3, 4, 5), (4, 5, 2, 3)),
    ("ij,j->i", (3, 4), (4,)),
    ("i,i->", (4,), (4,)),
    ("i,j->ij", (3,), (4,)),
    ("bi,bi->b", (3, 4), (3, 4)),
    ("xbyc,cbz->bzyx", (2, 3, 4, 5), (5, 3, 2)),
]


@pytest.mark.parametrize("spec,a,b", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum_matches_jax(spec, a, b):
    assert_converts(lambda x, y: jnp.einsum(spec, x, y), normal(*a), normal(*b), **TOL)


@pytest.mark.parametrize("a,b", [((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)), ((2, 1, 3, 4), (5, 4, 6)),
                                 ((3, 4), (4,))])
def test_matmul_with_batch_broadcast(a, b):
    assert_converts(jnp.matmul, normal(*a), normal(*b), **TOL)


@pytest.mark.parametrize("dims,a,b", [
    ((((1,), (0,)), ((), ())), (3, 4), (4, 5)),
    ((((0, 2), (2, 1)), ((1,), (0,))), (4, 2, 3), (2, 3, 4)),
    ((((2,), (1,)), ((0, 1), (2, 0))), (2, 3, 4, 5), (3, 4, 2, 6)),
    ((((), ()), ((0,), (1,))), (2, 3), (4, 2)),
])
def test_dot_general_with_explicit_dims(dims, a, b):
    assert_converts(lambda x, y: lax.dot_general(x, y, dims), normal(*a), normal(*b), **TOL)


@pytest.mark.parametrize("dtype", [np.int32, np.float16], ids=["int32", "float16"])
@pytest.mark.parametrize("spec,a,b", EINSUMS[3:6], ids=[e[0] for e in EINSUMS[3:6]])
def test_dot_general_in_other_dtypes(dtype, spec, a, b):
    x = (RNG.integers(-5, 5, a) if dtype == np.int32 else normal(*a)).astype(dtype)
    y = (RNG.integers(-5, 5, b) if dtype == np.int32 else normal(*b)).astype(dtype)
    assert_converts(lambda x, y: jnp.einsum(spec, x, y), x, y, rtol=1e-2, atol=1e-2)


def test_dot_general_with_preferred_type():
    a, b = normal(3, 4).astype(np.float16), normal(4, 5).astype(np.float16)
    assert_converts(lambda x, y: lax.dot_general(x, y, (((1,), (0,)), ((), ())), preferred_element_type=np.float32),
                    a, b, rtol=1e-2, atol=1e-2)


CONVS = [
    # (lhs shape, rhs shape, dimension_numbers)
    ((2, 3, 9, 8), (4, 3, 3, 3), ("NCHW", "OIHW", "NCHW")),
    ((2, 9, 8, 3), (3, 3, 3, 4), ("NHWC", "HWIO", "NHWC")),
    ((2, 9, 8, 3), (4, 3, 3, 3), ("NHWC", "OIHW", "NCHW")),
    ((9, 2, 8, 3), (3, 4, 3, 3), ("HNWC", "IOHW", "CWNH")),
    ((2, 3, 11), (4, 3, 3), ("NCH", "OIH", "NCH")),
    ((2, 11, 3), (3, 3, 4), ("NHC", "HIO", "NHC")),
]


@pytest.mark.parametrize("padding", ["SAME", "VALID", ((1, 2), (0, 1)), ((-1, 1), (2, -2))],
                         ids=["same", "valid", "explicit", "negative"])
@pytest.mark.parametrize("strides", [1, 2])
@pytest.mark.parametrize("lhs,rhs,numbers", CONVS, ids=["-".join(c[2]) for c in CONVS])
def test_conv_general_dilated_layouts_strides_padding(lhs, rhs, numbers, strides, padding):
    spatial = len(numbers[0]) - 2
    if not isinstance(padding, str):
        padding = padding[:spatial]
        if spatial == 1 and min(padding[0]) < 0:
            pytest.skip("XLA's CPU result for 1-D negative padding differs from the spec's: "
                        "test_1d_negative_padding_matches_the_spec checks it")
    fn = lambda x, w: lax.conv_general_dilated(x, w, (strides,) * spatial, padding,  # noqa: E731
                                               dimension_numbers=numbers)
    assert_converts(fn, normal(*lhs), normal(*rhs), **TOL)


@pytest.mark.parametrize("dilation", [(2, 1), (2, 3)])
def test_conv_with_rhs_dilation(dilation):
    fn = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=dilation,  # noqa: E731
                                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_converts(fn, normal(2, 10, 9, 3), normal(3, 3, 3, 4), **TOL)


@pytest.mark.parametrize("groups,cin,cout", [(2, 4, 6), (4, 4, 4), (3, 3, 6)], ids=["grouped", "depthwise", "multiplier"])
def test_conv_with_feature_groups(groups, cin, cout):
    fn = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=groups,  # noqa: E731
                                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_converts(fn, normal(2, 7, 6, cin), normal(3, 3, cin // groups, cout), **TOL)


@pytest.mark.parametrize("strides", [(1, 1), (2, 2), (2, 3)])
@pytest.mark.parametrize("padding", ["SAME", "VALID", ((1, 0), (2, 1))], ids=["same", "valid", "explicit"])
def test_conv_transpose_uses_lhs_dilation(strides, padding):
    fn = lambda x, w: lax.conv_transpose(x, w, strides, padding,  # noqa: E731
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_converts(fn, normal(2, 5, 4, 3), normal(3, 3, 3, 4), **TOL)


def test_conv_transpose_1d_and_lhs_dilation_with_window_strides():
    fn = lambda x, w: lax.conv_transpose(x, w, (2,), "SAME", dimension_numbers=("NHC", "HIO", "NHC"))  # noqa: E731
    assert_converts(fn, normal(2, 6, 3), normal(4, 3, 5), **TOL)
    fn = lambda x, w: lax.conv_general_dilated(x, w, (2, 1), ((1, 1), (0, 0)), lhs_dilation=(3, 2))  # noqa: E731
    assert_converts(fn, normal(1, 2, 5, 4), normal(3, 2, 3, 2), **TOL)


def test_conv_3d():
    fn = lambda x, w: lax.conv_general_dilated(x, w, (1, 2, 1), "SAME",  # noqa: E731
                                               dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
    assert_converts(fn, normal(1, 4, 5, 6, 2), normal(2, 3, 3, 2, 3), **TOL)


def test_conv_with_rhs_dilation_and_constant_weights():
    w = normal(3, 3, 3, 4)
    fn = lambda x: lax.conv_general_dilated(x, w, (1, 2), "VALID", rhs_dilation=(2, 2),  # noqa: E731
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_converts(fn, normal(2, 10, 9, 3), **TOL)


@pytest.mark.parametrize("batch_groups,numbers", [(2, ("NCHW", "OIHW", "NCHW")), (3, ("NHWC", "HWIO", "NHWC"))])
def test_batch_group_count(batch_groups, numbers):
    x, w = normal(6, 2, 5, 5), normal(6, 2, 3, 3)
    if numbers[0] == "NHWC":
        x, w = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
    fn = lambda x, w: lax.conv_general_dilated(x, w, (1, 2), "SAME", batch_group_count=batch_groups,  # noqa: E731
                                               dimension_numbers=numbers)
    assert_converts(fn, x, w, **TOL)


def test_batch_group_count_with_dynamic_batch_is_refused():
    from edgebuild.plugin import BuildError

    text = """
    func.func public @main(%x: tensor<?x2x5x5xf32>, %w: tensor<4x2x3x3xf32>) -> tensor<?x4x3x3xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {}
           {batch_group_count = 2 : i64, feature_group_count = 1 : i64}
           : (tensor<?x2x5x5xf32>, tensor<4x2x3x3xf32>) -> tensor<?x4x3x3xf32>
      return %0 : tensor<?x4x3x3xf32>
    }"""
    with pytest.raises(BuildError, match="batch_group_count"):
        onnx_from_mlir(text, "grouped.mlir")


def op_types(model):
    graph = model.graph
    return {node.op_type for node in (graph.node if hasattr(graph, "node") else graph)}


@pytest.mark.parametrize("dilation", [(1, 1), (2, 1)])
@pytest.mark.parametrize("strides", [(2, 2), (3, 2)])
@pytest.mark.parametrize("padding", ["SAME", "VALID", ((2, 1), (0, 2))], ids=["same", "valid", "explicit"])
def test_conv_transpose_with_constant_kernel_is_onnx_conv_transpose(strides, padding, dilation):
    w = normal(3, 3, 3, 4)
    fn = lambda x: lax.conv_transpose(x, w, strides, padding, rhs_dilation=dilation,  # noqa: E731
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))
    model = assert_converts(fn, normal(2, 5, 4, 3), **TOL)
    assert "ConvTranspose" in op_types(model)


@pytest.mark.parametrize("padding,fits", [(((2, 1), (1, 2)), True), (((3, 0), (0, 0)), False)])
def test_grouped_input_dilated_conv_with_constant_kernel(padding, fits):
    w = normal(6, 2, 3, 3)  # O, I/groups, H, W
    fn = lambda x: lax.conv_general_dilated(x, w, (1, 1), padding, lhs_dilation=(2, 3),  # noqa: E731
                                            feature_group_count=2)
    model = assert_converts(fn, normal(2, 4, 5, 4), **TOL)
    assert ("ConvTranspose" in op_types(model)) == fits


@pytest.mark.parametrize("padding", [(-1, 1), (2, -2), (-2, -1)])
def test_1d_negative_padding_matches_the_spec(padding):
    """Against pad-then-crop in numpy (what the spec says), as XLA's CPU result differs for 1-D."""
    from jax_checks import export, run_onnxruntime, to_onnx

    x, w = normal(2, 3, 11), normal(4, 3, 3)
    fn = lambda x, w: lax.conv_general_dilated(x, w, (1,), (padding,))  # noqa: E731
    got = run_onnxruntime(to_onnx(export(fn, x, w)), [x, w])[0]
    lo, hi = padding
    padded = np.pad(x, ((0, 0), (0, 0), (max(lo, 0), max(hi, 0))))
    padded = padded[:, :, max(-lo, 0):padded.shape[2] - max(-hi, 0)]
    want = np.stack([np.einsum("nck,ock->no", padded[:, :, j:j + 3], w) for j in range(padded.shape[2] - 2)], -1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("numbers", [("NHWC", "HWIO", "NHWC"), ("NCHW", "OIHW", "NCHW")])
def test_half_precision_convolution(numbers):
    x = normal(2, 7, 6, 3).astype(np.float16)
    w = normal(3, 3, 3, 4).astype(np.float16)
    if numbers[0] == "NCHW":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)
    fn = lambda x, w: lax.conv_general_dilated(x, w, (2, 1), "SAME", dimension_numbers=numbers)  # noqa: E731
    assert_converts(fn, x, w, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("reverse", ["[true, false]", "[false, true]"])
def test_window_reversal_is_refused(reverse):
    from edgebuild.plugin import BuildError

    text = f"""
    func.func public @main(%x: tensor<1x1x5x5xf32>, %w: tensor<1x1x3x3xf32>) -> tensor<1x1x3x3xf32> {{
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1],
           window = {{stride = [1, 1], reverse = {reverse}}}
           {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}}
           : (tensor<1x1x5x5xf32>, tensor<1x1x3x3xf32>) -> tensor<1x1x3x3xf32>
      return %0 : tensor<1x1x3x3xf32>
    }}"""
    with pytest.raises(BuildError, match="window_reversal"):
        onnx_from_mlir(text, "reversed.mlir")


DYNAMIC_DOTS = [
    # (lhs type, rhs type, result type, dims, lhs shape, rhs shape, einsum)
    ("?x3x4", "4x5", "?x3x5", "contracting_dims = [2] x [0]", (2, 3, 4), (4, 5), "bij,jk->bik"),
    ("?x?x4", "4x5", "?x?x5", "contracting_dims = [2] x [0]", (2, 6, 4), (4, 5), "bij,jk->bik"),
    ("?x3x4", "?x4x5", "?x3x5", "batching_dims = [0] x [0], contracting_dims = [2] x [1]", (3, 3, 4), (3, 4, 5),
     "bij,bjk->bik"),
    ("4x?x3", "?x4x2", "?x3x2", "batching_dims = [1] x [0], contracting_dims = [0] x [1]", (4, 5, 3), (5, 4, 2),
     "jbi,bjk->bik"),
    ("?x4", "4", "?", "contracting_dims = [1] x [0]", (7, 4), (4,), "ij,j->i"),
    ("4x?", "4x?", "?x?", "contracting_dims = [0] x [0]", (4, 3), (4, 6), "ji,jk->ik"),
]


@pytest.mark.parametrize("lhs_type,rhs_type,result_type,dims,a,b,spec", DYNAMIC_DOTS, ids=[d[6] + d[0] for d in DYNAMIC_DOTS])
def test_dot_general_with_dynamic_dims(lhs_type, rhs_type, result_type, dims, a, b, spec):
    from jax_checks import run_onnxruntime

    text = f"""
    func.func public @main(%x: tensor<{lhs_type}xf32>, %w: tensor<{rhs_type}xf32>) -> tensor<{result_type}xf32> {{
      %0 = stablehlo.dot_general %x, %w, {dims} : (tensor<{lhs_type}xf32>, tensor<{rhs_type}xf32>) -> tensor<{result_type}xf32>
      return %0 : tensor<{result_type}xf32>
    }}"""
    model = onnx_from_mlir(text, "dynamic.mlir")
    x, w = normal(*a), normal(*b)
    np.testing.assert_allclose(run_onnxruntime(model, [x, w])[0], np.einsum(spec, x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", ["stride = [1, 2], pad = [[1, 1], [0, 1]]",
                                    "pad = [[-1, 2], [2, 2]], lhs_dilate = [2, 3]"])
def test_convolution_with_dynamic_batch(window):
    from jax import lax as jlax

    from jax_checks import run_onnxruntime

    x, w = normal(3, 5, 6, 2), normal(3, 3, 2, 4)
    strides = (1, 2) if "stride" in window else (1, 1)
    padding = ((1, 1), (0, 1)) if "stride" in window else ((-1, 2), (2, 2))
    dilation = (2, 3) if "lhs_dilate" in window else (1, 1)
    want = np.asarray(jlax.conv_general_dilated(x, w, strides, padding, lhs_dilation=dilation,
                                                dimension_numbers=("NHWC", "HWIO", "NHWC")))
    result = "?x" + "x".join(str(d) for d in want.shape[1:])
    text = f"""
    func.func public @main(%x: tensor<?x5x6x2xf32>, %w: tensor<3x3x2x4xf32>) -> tensor<{result}xf32> {{
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
           window = {{{window}}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}}
           : (tensor<?x5x6x2xf32>, tensor<3x3x2x4xf32>) -> tensor<{result}xf32>
      return %0 : tensor<{result}xf32>
    }}"""
    model = onnx_from_mlir(text, "dynamic.mlir")
    np.testing.assert_allclose(run_onnxruntime(model, [x, w])[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layer", ["conv", "grouped_conv", "conv_transpose", "dense"])
def test_flax_layers_with_their_parameters_as_constants(layer):
    nn = pytest.importorskip("flax.linen")
    module = {"conv": nn.Conv(8, (3, 3), strides=2, padding="SAME"),
              "grouped_conv": nn.Conv(8, (3, 3), feature_group_count=4, kernel_dilation=2),
              "conv_transpose": nn.ConvTranspose(5, (3, 3), strides=(2, 2)),
              "dense": nn.Dense(7)}[layer]
    x = normal(2, 9, 8, 4)
    params = module.init(jax.random.PRNGKey(0), x)
    assert_converts(lambda x: module.apply(params, x), x, **TOL)
