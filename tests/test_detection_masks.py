"""Instance masks and other per-detection outputs in validate.detections, and the loop that pastes them.

A Mask R-CNN's masks are [N, 1, H, W]: one row per detection beside its boxes, compared over the
matched pairs. Keypoints ([N, K, 3], scores [N, K]) likewise. An attached output that holds no row
per detection on either side is compared element by element; one that has rows on one side only
is an error naming both shapes.

torchvision pastes each mask into the image in an ONNX Loop whose carried value starts empty and
grows by a row per detection; the exporter declares that value with its first shape, [0, H, W].
The optimize stage must not trust that declaration (edgebuild.graph.loop_carried).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest

from edgebuild.errors import BuildError
from edgebuild.graph.loop_carried import relaxed_shape
from edgebuild.graph.optimize import optimize
from edgebuild.recipe.validation import DetectionOutputs
from edgebuild.verify.metrics import aggregate, compare
from edgebuild.verify.thresholds import check

MASKS = DetectionOutputs(boxes="boxes", scores="scores", labels="labels", attached=["masks"])
KEYPOINTS = DetectionOutputs(boxes="boxes", scores="scores", labels="labels",
                             attached=["keypoints", "keypoints_scores"])
BATCHES = [(), (1,), (2,)]
COUNTS = [0, 1, 4]
LIMITS = {"cosine_min": 0.9999, "box_match_min": 0.99}


def detections(n: int, batch=(), seed: int = 0, size: int = 16) -> dict[str, np.ndarray]:
    """n well-separated boxes per image with masks (pasted probabilities) and five keypoints each."""
    rng = np.random.default_rng(seed)
    images = int(np.prod(batch, dtype=int))
    corners = np.stack([np.arange(n) * 20.0, np.zeros(n)], axis=1)
    boxes = np.concatenate([corners, corners + 10.0], axis=1).astype(np.float32)
    scores = np.linspace(0.9, 0.5, n, dtype=np.float32) if n else np.zeros(0, np.float32)
    labels = (np.arange(n) % 3 + 1).astype(np.int64)
    found = {"boxes": np.broadcast_to(boxes, (*batch, n, 4)).copy(),
             "scores": np.broadcast_to(scores, (*batch, n)).copy(),
             "labels": np.broadcast_to(labels, (*batch, n)).copy()}
    found["masks"] = rng.random((*batch, n, 1, size, size), dtype=np.float32)
    found["keypoints"] = (rng.random((*batch, n, 5, 3)) * 40).astype(np.float32)
    found["keypoints_scores"] = rng.standard_normal((*batch, n, 5)).astype(np.float32)
    assert images >= 1
    return found


def permuted(found: dict) -> dict:
    """The same detections in reverse order, every per-detection output moved with its box."""
    n = found["boxes"].shape[-2]
    order = np.arange(n)[::-1]
    axis = found["boxes"].ndim - 2
    return {name: np.take(array, order, axis=axis) for name, array in found.items()}


def at_fp16(found: dict) -> dict:
    return {name: array.astype(np.float16).astype(np.float32) if array.dtype == np.float32 else array
            for name, array in found.items()}


def only(found: dict, group: DetectionOutputs) -> dict:
    return {name: found[name] for name in group.outputs}


# -- masks and keypoints over matched pairs ------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("group", [MASKS, KEYPOINTS], ids=["masks", "keypoints"])
def test_per_detection_rows_are_compared_over_matched_pairs(group, precision, n, batch):
    reference = only(detections(n, batch), group)
    candidate = permuted(reference)
    candidate = at_fp16(candidate) if precision == "fp16" else candidate
    found = compare(reference, candidate, detections=[group])
    assert found["boxes"]["box_match"] == 1.0
    assert found["boxes"]["box_reference"] == n * int(np.prod(batch, dtype=int))
    limit = 0.9999 if precision == "fp32" else 0.999
    for name in group.attached:
        assert found[name]["cosine"] >= limit, name  # rows in matched order: the permutation undone
        assert "top1_agreement" not in found[name]  # a mask's or keypoint's last dim is no class score
    assert check(aggregate([found]), {**LIMITS, "cosine_min": limit}) == []


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("group", [MASKS, KEYPOINTS], ids=["masks", "keypoints"])
def test_a_wrong_row_of_a_matched_pair_fails_the_cosine(group, batch):
    reference = only(detections(4, batch), group)
    candidate = permuted(reference)
    name = group.attached[0]
    wrong = candidate[name].copy()
    wrong[(0,) * len(batch) + (2,)] = 1.0 - wrong[(0,) * len(batch) + (2,)]  # one detection's row, not its box
    candidate[name] = wrong
    found = compare(reference, candidate, detections=[group])
    assert found["boxes"]["box_match"] == 1.0
    assert found[name]["cosine"] < 0.999
    failures = check(aggregate([found]), LIMITS)
    assert [f for f in failures if f.output == name and f.metric == "cosine"]


def test_a_mask_compared_in_the_given_order_would_fail():
    """The reason masks belong in the group: element by element, a reordering alone fails."""
    reference = only(detections(4), MASKS)
    candidate = permuted(reference)
    grouped = compare(reference, candidate, detections=[MASKS])
    ungrouped = compare(reference, candidate, detections=[DetectionOutputs(boxes="boxes", scores="scores",
                                                                          labels="labels")])
    assert grouped["masks"]["cosine"] == pytest.approx(1.0)
    assert ungrouped["masks"]["cosine"] < 0.9


@pytest.mark.parametrize("n", COUNTS)
def test_an_unmatched_detection_leaves_its_mask_out(n):
    """A borderline box the candidate drops takes its mask with it; the others still compare."""
    reference = only(detections(n), MASKS)
    reference["scores"][-1:] = 0.051  # the last box, if any, just above the 0.05 cut
    candidate = {name: array[:max(n - 1, 0)] for name, array in reference.items()}
    group = MASKS.model_copy(update={"score_threshold": 0.05, "score_margin": 0.01})
    found = compare(reference, candidate, detections=[group])
    assert found["boxes"]["box_match"] == 1.0
    assert found["boxes"]["box_borderline"] == (1 if n else 0)
    if n > 1:
        assert found["masks"]["cosine"] == pytest.approx(1.0)


# -- outputs that hold no row per detection ------------------------------------------------------


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("extra_shape", [(1, 7), (3,), (1, 1, 8, 8)], ids=["vector", "flat", "image"])
def test_an_image_level_attached_output_is_compared_element_by_element(extra_shape, n):
    if extra_shape[0] == n:
        pytest.skip("its first dim is the detection count: it reads as per-detection")
    group = DetectionOutputs(boxes="boxes", scores="scores", labels="labels", attached=["masks", "summary"])
    reference = only(detections(n), MASKS)
    candidate = permuted(reference)
    reference["summary"] = np.random.default_rng(3).standard_normal(extra_shape).astype(np.float32)
    candidate["summary"] = reference["summary"].copy()
    found = compare(reference, candidate, detections=[group])
    assert found["summary"]["cosine"] == pytest.approx(1.0)
    candidate["summary"] = -reference["summary"]
    found = compare(reference, candidate, detections=[group])
    assert found["summary"]["cosine"] == pytest.approx(-1.0)  # element by element: a real difference shows


@pytest.mark.parametrize("rows_in", ["reference", "candidate"])
@pytest.mark.parametrize("n", [2, 4])
def test_rows_on_one_side_only_name_the_output_and_both_shapes(rows_in, n):
    """The pasted-masks case: N masks in the source, one in the candidate (or the other way)."""
    full = only(detections(n), MASKS)
    cut = dict(full, masks=full["masks"][:1])
    reference, candidate = (full, cut) if rows_in == "reference" else (cut, full)
    with pytest.raises(BuildError) as raised:
        compare(reference, candidate, detections=[MASKS])
    message = str(raised.value)
    assert "'masks'" in message and f"[{n}, 1, 16, 16]" in message and "[1, 1, 16, 16]" in message
    assert f"in the {rows_in} only" in message
    assert raised.value.hint


def test_scores_without_a_row_per_detection_stay_an_error():
    reference = only(detections(3), MASKS)
    candidate = dict(reference, scores=reference["scores"][:1])
    with pytest.raises(BuildError, match="'scores'.*does not start with the boxes'"):
        compare(reference, candidate, detections=[MASKS])


# -- the loop that pastes masks, through the optimize stage --------------------------------------


def _shape(dims):
    return ir.Shape(dims)


@pytest.mark.parametrize("declared, produced, expected", [
    ([0, 8, 8], [1, 8, 8], [None, 8, 8]),  # an accumulator declared with its first shape
    ([0, 8, 8], ["n", "h", "w"], [None, None, None]),  # the body's output says nothing certain
    ([0, 8, 8], None, [None, 8, 8]),  # no output shape: only an empty start is doubted
    ([2, 3], [2, 3], None),  # a state of fixed shape keeps it
    ([2, 0], [2, 1], [2, None]),  # growing along another axis
    (["b", 3], ["b", 3], None),  # the same named dim
    ([2, 3], [2, 3, 1], None),  # a rank change is the lowering's to refuse
])
def test_a_carried_dim_is_kept_only_where_the_body_keeps_it(declared, produced, expected):
    relaxed = relaxed_shape(_shape(declared), None if produced is None else _shape(produced))
    if expected is None:
        assert relaxed is None
    else:
        assert [d if isinstance(d, int) else d.value for d in relaxed.dims] == expected


def _accumulator_loop(start_rows: int, axis: int, trip: int) -> onnx.ModelProto:
    """res = cat(res, x[i] * (i + 1)) along ``axis`` for i < trip, res starting with ``start_rows``
    along it; the carried value declared with its start's shape, as the TorchScript exporter does."""
    T = onnx.TensorProto
    row_shape = [1, 3] if axis == 0 else [3, 1]
    start_shape = [start_rows, 3] if axis == 0 else [3, start_rows]
    body = oh.make_graph(
        [oh.make_node("Unsqueeze", ["i", "zero"], ["i1"]),
         oh.make_node("Gather", ["x", "i1"], ["row"], axis=0),  # [1, 3]
         oh.make_node("Cast", ["i"], ["i_f"], to=T.FLOAT),
         oh.make_node("Add", ["i_f", "one"], ["scale"]),
         oh.make_node("Mul", ["row", "scale"], ["scaled"]),
         oh.make_node("Reshape", ["scaled", "row_shape"], ["shaped"]),
         oh.make_node("Concat", ["res", "shaped"], ["res_out"], axis=axis),
         oh.make_node("Identity", ["cond"], ["cond_out"])],
        "body",
        [oh.make_tensor_value_info("i", T.INT64, []), oh.make_tensor_value_info("cond", T.BOOL, []),
         oh.make_tensor_value_info("res", T.FLOAT, start_shape)],
        [oh.make_tensor_value_info("cond_out", T.BOOL, []),
         oh.make_tensor_value_info("res_out", T.FLOAT, [None, None])],
        initializer=[onh.from_array(np.array([0], np.int64), "zero"), onh.from_array(np.float32(1.0), "one"),
                     onh.from_array(np.array(row_shape, np.int64), "row_shape")])
    graph = oh.make_graph(
        [oh.make_node("Loop", ["trip", "keep", "start"], ["result"], body=body)],
        "accumulate",
        [oh.make_tensor_value_info("x", T.FLOAT, [max(trip, 1), 3])],
        [oh.make_tensor_value_info("result", T.FLOAT, [None, None])],
        initializer=[onh.from_array(np.array(trip, np.int64), "trip"), onh.from_array(np.array(True), "keep"),
                     onh.from_array(np.ones(start_shape, np.float32), "start")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def _run(path, feeds):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("start_rows", [0, 1])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("trip", [0, 1, 3])
def test_an_accumulating_loop_keeps_every_row_through_optimize(tmp_path, start_rows, axis, trip):
    model = _accumulator_loop(start_rows, axis, trip)
    source = tmp_path / "source.onnx"
    onnx.save(model, source)
    optimize(source, tmp_path / "optimized")
    feeds = {"x": np.random.default_rng(0).standard_normal((max(trip, 1), 3)).astype(np.float32)}
    [expected] = _run(source, feeds)
    [found] = _run(tmp_path / "optimized" / "model.onnx", feeds)
    assert expected.shape[axis] == start_rows + trip
    assert found.shape == expected.shape
    np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6)


def _paste_masks_model(n: int):
    """torchvision's paste_masks_in_image on n masks, as a Mask R-CNN's last step (7x7 masks into 32x32)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("edgebuild_testplugin.torchvision_models")  # torchvision, its C ops in plain torch
    from torchvision.models.detection.roi_heads import paste_masks_in_image

    class Paste(torch.nn.Module):
        def forward(self, masks, boxes):
            return paste_masks_in_image(masks, boxes, (32, 32))

    generator = torch.Generator().manual_seed(n)
    masks = torch.rand(n, 1, 7, 7, generator=generator)
    corner = torch.rand(n, 2, generator=generator) * 20
    boxes = torch.cat([corner, corner + 4 + torch.rand(n, 2, generator=generator) * 8], dim=1)
    return Paste().eval(), masks, boxes


@pytest.mark.parametrize("n", [0, 1, 3])
def test_torchvisions_pasted_masks_keep_one_row_per_detection_through_optimize(tmp_path, n):
    torch = pytest.importorskip("torch")
    module, masks, boxes = _paste_masks_model(n)
    source = tmp_path / "paste.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (masks, boxes), str(source), input_names=["masks", "boxes"], opset_version=18,
                          dynamo=False)  # the TorchScript exporter: its scripted loop, as Mask R-CNN's export has
        eager = module(masks, boxes).numpy()
    assert any(node.op_type == "Loop" for node in onnx.load(str(source)).graph.node)
    optimize(source, tmp_path / "optimized")
    feeds = {"masks": masks.numpy(), "boxes": boxes.numpy()}
    [found] = _run(tmp_path / "optimized" / "model.onnx", feeds)
    assert eager.shape == (n, 1, 32, 32)
    assert found.shape == eager.shape
    np.testing.assert_allclose(found, eager, rtol=1e-5, atol=1e-5)
