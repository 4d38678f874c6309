"""AffineGrid, Col2Im, MaxUnpool and DeformConv lowerings against onnxruntime (lowering/ops/
affine_grid.py, col2im.py, unpool.py, deform_conv.py).

Each case lowers a one-node model to MIL, runs it in edgebuild's MIL interpreter and compares
with onnxruntime on the same inputs; shape parameters are initializers.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import check, check_op, rand, single_node_model

RTOL, ATOL = 1e-4, 1e-5


def ints(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize("size", [(3, 2, 4, 7), (2, 1, 3, 4, 5), (1, 1, 1, 6)], ids=str)
@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(size, align_corners):
    if align_corners and 1 in size[2:]:
        pytest.skip("a one-pixel axis with align_corners has no agreed place: -1 (ONNX reference), +1 (onnxruntime)")
    dims = len(size) - 2
    inputs = {"theta": rand(size[0], dims, dims + 1, seed=31), "size": ints(*size)}
    check_op("AffineGrid", inputs, attrs={"align_corners": align_corners}, opset=20, initializers=["size"],
             rtol=RTOL, atol=ATOL)


COL2IM_CASES = {
    "overlapping_blocks": ((2, 3 * 3 * 3, 20), (7, 6), (3, 3), {}),
    "strides_dilations_pads": ((1, 2 * 4, 12), (6, 9), (2, 2), {"strides": [2, 3], "dilations": [2, 1],
                                                                  "pads": [1, 0, 0, 2]}),
    "stride_leaves_a_tail": ((1, 4, 6), (5, 7), (2, 2), {"strides": [2, 2]}),
    "one_dimensional": ((2, 3 * 4, 5), (8,), (4,), {}),
}


@pytest.mark.parametrize("case", sorted(COL2IM_CASES))
def test_col2im(case):
    shape, image, block, attrs = COL2IM_CASES[case]
    inputs = {"input": rand(*shape, seed=32), "image_shape": ints(*image), "block_shape": ints(*block)}
    check_op("Col2Im", inputs, attrs=attrs, opset=18, initializers=["image_shape", "block_shape"], rtol=RTOL, atol=ATOL)


def pooled_with_indices(x, kernel, strides, pads=(0, 0, 0, 0)):
    """MaxPool's values and indices from onnxruntime, the way a model feeds MaxUnpool."""
    from onnx_cases import run_onnxruntime

    model = single_node_model("MaxPool", {"x": x}, outputs=["values", "indices"], opset=12,
                              attrs={"kernel_shape": kernel, "strides": strides, "pads": list(pads)})
    out = run_onnxruntime(model, {"x": x})
    return out["values"], out["indices"]


@pytest.mark.parametrize("x_shape,kernel,strides,pads,output_shape", [
    ((2, 3, 8, 10), [2, 2], [2, 2], [0, 0, 0, 0], None),
    ((1, 2, 9, 7), [3, 3], [2, 2], [1, 1, 1, 1], None),
    ((2, 3, 9, 10), [2, 3], [2, 1], [0, 0, 0, 0], (2, 3, 9, 10)),  # the pool dropped a row: give its shape
    ((1, 1, 5, 5), [2, 2], [2, 2], [0, 0, 0, 0], (1, 1, 7, 6)),
], ids=str)
def test_max_unpool(x_shape, kernel, strides, pads, output_shape):
    values, indices = pooled_with_indices(rand(*x_shape, seed=33), kernel, strides, pads)
    inputs = {"x": values, "i": indices}
    if output_shape is not None:
        inputs["output_shape"] = ints(*output_shape)
    check_op("MaxUnpool", inputs, attrs={"kernel_shape": kernel, "strides": strides, "pads": pads}, opset=11,
             initializers=["output_shape"] if output_shape else [], rtol=RTOL, atol=ATOL)


DEFORM_CASES = {
    "groups_and_offset_groups": ((2, 4, 7, 6), (6, 2, 3, 3), {"group": 2, "offset_group": 2, "pads": [1, 1, 1, 1]}),
    "strides_dilations": ((1, 3, 9, 8), (4, 3, 2, 3), {"strides": [2, 1], "dilations": [1, 2]}),
    "mask_and_bias": ((1, 2, 6, 6), (3, 2, 3, 3), {"pads": [1, 0, 1, 0]}),
}


@pytest.mark.parametrize("case", sorted(DEFORM_CASES))
def test_deform_conv(case):
    x_shape, w_shape, attrs = DEFORM_CASES[case]
    kh, kw = w_shape[2:]
    strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    out = [(x_shape[2 + d] + pads[d] + pads[2 + d] - dilations[d] * (w_shape[2 + d] - 1) - 1) // strides[d] + 1
           for d in range(2)]
    offset_groups = attrs.get("offset_group", 1)
    inputs = {"x": rand(*x_shape, seed=34), "w": rand(*w_shape, seed=35),
              # offsets up to 2.5 pixels reach past the border, where samples are zero
              "offset": rand(x_shape[0], offset_groups * kh * kw * 2, *out, seed=36, low=-2.5, high=2.5)}
    if case == "mask_and_bias":
        inputs["b"] = rand(w_shape[0], seed=37)
        inputs["mask"] = rand(x_shape[0], offset_groups * kh * kw, *out, seed=38, low=0.0, high=1.0)
    model = single_node_model("DeformConv", inputs, attrs={"kernel_shape": [kh, kw], **attrs}, opset=19,
                              initializers=["w"])
    check(model, inputs, initializers=["w"], rtol=RTOL, atol=ATOL)
