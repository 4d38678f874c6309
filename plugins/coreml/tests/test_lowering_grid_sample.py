"""GridSample lowering against onnx's reference evaluator, which covers every mode, padding and
rank onnxruntime lacks (lowering/ops/grid_sample.py).

Each case lowers a one-node model to MIL and runs it in edgebuild's MIL interpreter.
"""

from __future__ import annotations

import pytest
from onnx_cases import check_reference, rand, single_node_model

GRID_CASES = [
    (mode, padding, align, rank)
    for mode in ("nearest", "linear", "cubic")
    for padding in ("zeros", "border", "reflection")
    for align in (0, 1)
    for rank in (4, 5)
    if not (mode == "cubic" and rank == 5)  # ONNX defines cubic for 4-D inputs only
]


@pytest.mark.parametrize("mode,padding,align,rank", GRID_CASES, ids=lambda v: str(v))
def test_grid_sample(mode, padding, align, rank):
    spatial, out = ((3, 4), (2, 5)) if rank == 4 else ((3, 2, 4), (2, 3, 2))
    x = rand(2, 2, *spatial, seed=40)
    # Coordinates well past [-1, 1] exercise every padding mode's folding and clamping.
    grid = rand(2, *out, rank - 2, seed=41, low=-2.6, high=2.6)
    grid[0, 0, 0] = 0.5 / spatial[-1] * 2 - 1  # a pixel centre's exact half, where rounding modes differ
    inputs = {"x": x, "grid": grid}
    model = single_node_model("GridSample", inputs, attrs={"mode": mode, "padding_mode": padding, "align_corners": align},
                              opset=22)
    check_reference(model, inputs, rtol=1e-4, atol=1e-5)
