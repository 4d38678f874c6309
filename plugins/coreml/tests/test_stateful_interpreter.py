"""A stateful program in the MIL interpreter: states kept across calls, slices whose ends come from
a ``position`` input (the KV-cache pattern of lowering.stateful), saved and read back as a package;
and InferenceSession on stateful and state-less artifacts."""

from __future__ import annotations

import json

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from interpreter_programs import saved, spec  # noqa: E402

from edgebuild.bundle.decoding import chunk_lengths  # noqa: E402
from edgebuild.bundle.session import InferenceSession  # noqa: E402
from edgebuild.errors import BuildError  # noqa: E402
from edgebuild_coreml.interpreter import load_mlpackage, run_program  # noqa: E402

CONTEXT = 8


def _running_sum_program():
    """cache [1, 1, CONTEXT, 1] (fp16): rows position..position+Q take x; out = sum of rows 0..position+Q."""

    @mb.program(input_specs=[mb.StateTensorSpec((1, 1, CONTEXT, 1), dtype=types.fp16),
                             spec((1, 1, ct.RangeDim(1, 4).symbol, 1)), spec((1,), types.int32)],
                opset_version=ct.target.iOS18)
    def prog(cache, x, position):
        whole = mb.read_state(input=cache)
        length = mb.slice_by_index(x=mb.shape(x=x), begin=[2], end=[3])
        end = mb.add(x=position, y=length)
        begin4 = mb.concat(values=[np.zeros(2, np.int32), position, np.zeros(1, np.int32)], axis=0)
        end4 = mb.concat(values=[np.array([1, 1], np.int32), end, np.array([1], np.int32)], axis=0)
        updated = mb.slice_update(x=whole, update=mb.cast(x=x, dtype="fp16"), begin=begin4, end=end4)
        mb.coreml_update_state(state=cache, value=updated)
        kept = mb.slice_by_index(x=mb.cast(x=updated, dtype="fp32"), begin=np.zeros(4, np.int32), end=end4)
        return mb.reduce_sum(x=kept, axes=[2], keep_dims=False, name="out")

    return prog


def test_states_persist_across_calls_with_position_slices(tmp_path):
    program = load_mlpackage(saved(_running_sum_program(), tmp_path / "m.mlpackage", target=ct.target.iOS18))
    states: dict = {}
    fed, position = [], 0
    for chunk in ([1.0, 2.0, 3.0], [4.0], [0.5, 0.25]):
        x = np.array(chunk, np.float32).reshape(1, 1, -1, 1)
        out = run_program(program, {"x": x, "position": np.array([position], np.int32)}, states=states)
        fed += chunk
        position += len(chunk)
        np.testing.assert_allclose(out["out"].reshape(-1), [sum(fed)], rtol=1e-3)
    cache = states["cache"]
    assert cache.dtype == np.float16 and cache.shape == (1, 1, CONTEXT, 1)
    np.testing.assert_allclose(cache.reshape(-1)[:position], fed)
    assert not cache.reshape(-1)[position:].any()  # rows past the position are untouched
    fresh = run_program(program, {"x": np.ones((1, 1, 1, 1), np.float32), "position": np.array([0], np.int32)})
    assert float(fresh["out"].reshape(-1)[0]) == 1.0  # without states: a zero cache, as make_state()


def test_chunks_take_the_largest_length_first():
    assert chunk_lengths(150, [1, 16, 64]) == [64, 64, 16, 1, 1, 1, 1, 1, 1]
    assert chunk_lengths(5, {"range": [1, 4]}) == [4, 1]
    assert chunk_lengths(0, [1]) == []


def test_session_on_a_stateful_package(tmp_path):
    """The session keeps the state and the position; generate-style misuse fails clearly."""
    path = saved(_running_sum_program(), tmp_path / "sum.mlpackage", target=ct.target.iOS18)
    model = ct.models.MLModel(str(path), skip_model_load=True)
    model.user_defined_metadata["edgebuild.generate"] = json.dumps(
        {"max_context": CONTEXT, "query_lengths": {"range": [1, 4]}, "logits": "all", "states": []})
    path = tmp_path / "described.mlpackage"
    model.save(str(path))
    session = InferenceSession(path)
    assert session.position == 0
    # the toy program calls its token input x; the session only checks input_ids is there
    with pytest.raises(BuildError, match="takes input_ids"):
        session.run({"x": np.ones((1, 1, 2, 1), np.float32)})
    session.reset()
    assert session.position == 0


def test_generate_on_a_stateless_package_says_what_it_needs(tmp_path):
    @mb.program(input_specs=[spec((1, 4))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.relu(x=x, name="y")

    session = InferenceSession(saved(prog, tmp_path / "plain.mlpackage"))
    with pytest.raises(BuildError, match="needs a stateful artifact .* generate section"):
        session.generate([1, 2, 3], 4)
    np.testing.assert_array_equal(session.run({"x": -np.ones((1, 4), np.float32)})["y"], np.zeros((1, 4)))
