"""Validation inputs: config parsing, determinism, dtypes/shapes, tokens, files and images."""

import importlib.util
import sys

import numpy as np
import pytest
from pydantic import ValidationError

from edgebuild.errors import UsageError
from edgebuild.recipe.validation import ValidateSection
from edgebuild.verify.inputs import generate_inputs


def section(**fields):
    return ValidateSection.model_validate(fields)


# -- config ---------------------------------------------------------------------------------

def test_defaults():
    spec = ValidateSection()
    assert spec.samples == 8 and spec.inputs == {} and spec.thresholds.model_dump(exclude_none=True) == {}
    assert spec.fp16_emulation == "auto"


def test_unknown_keys_rejected():
    with pytest.raises(ValidationError, match="cosine_mni"):
        section(thresholds={"cosine_mni": 0.9})
    with pytest.raises(ValidationError, match="seeed"):
        section(inputs={"x": {"random": {"seeed": 1}}})


def test_input_source_needs_exactly_one_kind():
    with pytest.raises(ValidationError, match="exactly one"):
        section(inputs={"x": {"random": {}, "value": 3}})
    with pytest.raises(ValidationError, match="exactly one"):
        section(inputs={"x": {}})
    with pytest.raises(ValidationError, match="'key' only applies"):
        section(inputs={"x": {"value": 1, "key": "x"}})


def test_yaml_booleans_for_fp16_emulation_and_per_output_merge():
    spec = section(fp16_emulation=False, thresholds={"cosine_min": 0.995, "max_abs_max": 0.1},
                   per_output={"logits": {"thresholds": {"cosine_min": 0.99}}})
    assert spec.fp16_emulation == "off"
    assert spec.thresholds_for("logits").model_dump(exclude_none=True) == {"cosine_min": 0.99, "max_abs_max": 0.1}
    assert spec.thresholds_for("other").cosine_min == 0.995


# -- random ---------------------------------------------------------------------------------

SPECS = {"x": {"shape": [2, 3, 4], "dtype": "float16"}, "k": {"shape": [5], "dtype": "int32"}}


def test_random_is_deterministic_with_right_dtype_and_shape(tmp_path):
    spec = section(samples=3, inputs={"x": {"random": {"low": -2, "high": 2, "seed": 7}},
                                      "k": {"random": {"low": 3, "high": 9, "seed": 7}}})
    first = generate_inputs(spec, SPECS, tmp_path)
    again = generate_inputs(spec, SPECS, tmp_path)
    assert len(first) == 3
    for a, b in zip(first, again):
        for name in SPECS:
            np.testing.assert_array_equal(a[name], b[name])
    for sample in first:
        assert sample["x"].dtype == np.float16 and sample["x"].shape == (2, 3, 4)
        assert sample["k"].dtype == np.int32 and sample["k"].shape == (5,)
        assert sample["x"].min() >= -2 and sample["x"].max() <= 2
        assert sample["k"].min() >= 3 and sample["k"].max() < 9
    assert not np.array_equal(first[0]["x"], first[1]["x"])  # samples differ
    other_seed = generate_inputs(section(samples=1, inputs={"x": {"random": {"seed": 8}}, "k": {"value": 1}}), SPECS, tmp_path)
    assert not np.array_equal(other_seed[0]["x"], first[0]["x"])


def test_normal_distribution_clipped(tmp_path):
    spec = section(samples=2, inputs={"x": {"random": {"distribution": "normal", "mean": 5, "std": 2, "low": 4, "high": 6}}})
    big = {"x": {"shape": [4000], "dtype": "float32"}}
    x = generate_inputs(spec, big, tmp_path)[0]["x"]
    assert x.min() >= 4 and x.max() <= 6 and abs(float(x.mean()) - 5) < 0.1


def test_unlisted_inputs_get_defaults_but_integers_need_a_recipe(tmp_path):
    [sample] = generate_inputs(section(samples=1), {"x": SPECS["x"]}, tmp_path)
    assert sample["x"].dtype == np.float16 and 0 <= sample["x"].min() and sample["x"].max() < 1
    with pytest.raises(UsageError, match=r"validate.inputs.k.*int32"):
        generate_inputs(section(samples=1), SPECS, tmp_path)


def test_errors_name_the_field(tmp_path):
    with pytest.raises(UsageError, match=r"validate.inputs.nope: the model has no input 'nope'"):
        generate_inputs(section(inputs={"nope": {"random": {}}}), SPECS, tmp_path)
    with pytest.raises(UsageError, match=r"source.inputs.x.shape"):
        generate_inputs(section(), {"x": {"shape": ["batch", 3], "dtype": "float32"}}, tmp_path)


def test_value_input(tmp_path):
    specs = {"sr": {"shape": [1], "dtype": "int64"}}
    samples = generate_inputs(section(samples=2, inputs={"sr": {"value": 16000}}), specs, tmp_path)
    assert [s["sr"].tolist() for s in samples] == [[16000], [16000]] and samples[0]["sr"].dtype == np.int64


# -- tokens ---------------------------------------------------------------------------------

BERT = {
    "input_ids": {"shape": [2, 16], "dtype": "int64"},
    "attention_mask": {"shape": [2, 16], "dtype": "int64"},
    "token_type_ids": {"shape": [2, 16], "dtype": "int32"},
}


def test_tokens_layout_with_mask_and_type_ids(tmp_path):
    spec = section(samples=4, inputs={"input_ids": {"tokens": {"vocab_size": 50, "seed": 1, "special": {"first": 101 % 50, "last": 2}, "pad": 0}}})
    samples = generate_inputs(spec, BERT, tmp_path)
    for sample in samples:
        ids, mask, types = sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]
        assert ids.shape == mask.shape == types.shape == (2, 16)
        assert types.dtype == np.int32 and not types.any()
        for row_ids, row_mask in zip(ids, mask):
            real = int(row_mask.sum())
            assert 8 <= real <= 16
            assert row_mask[:real].all() and not row_mask[real:].any()  # mask is a prefix of ones
            assert row_ids[0] == 1 and row_ids[real - 1] == 2
            assert (row_ids[real:] == 0).all()
            body = row_ids[1:real - 1]
            assert ((body >= 0) & (body < 50)).all() and not np.isin(body, [0, 1, 2]).any()
    assert np.array_equal(samples[0]["input_ids"], generate_inputs(spec, BERT, tmp_path)[0]["input_ids"])


def test_tokens_fixed_length_and_length_mismatch(tmp_path):
    spec = section(samples=1, inputs={"input_ids": {"tokens": {"vocab_size": 30522, "special": {"first": 101, "last": 102}, "real_tokens": 5}}})
    [sample] = generate_inputs(spec, {"input_ids": BERT["input_ids"]}, tmp_path)
    row = sample["input_ids"][0]
    assert row[0] == 101 and row[4] == 102 and (row[5:] == 0).all() and (row[1:4] != 0).all()
    bad = section(inputs={"input_ids": {"tokens": {"vocab_size": 10, "length": 128}}})
    with pytest.raises(UsageError, match=r"validate.inputs.input_ids.tokens.length"):
        generate_inputs(bad, {"input_ids": BERT["input_ids"]}, tmp_path)


# -- files ----------------------------------------------------------------------------------

def test_npz_and_npy_files(tmp_path):
    stack = np.arange(3 * 2 * 3, dtype=np.float64).reshape(3, 2, 3)
    np.savez(tmp_path / "inputs.npz", y=stack, other=np.zeros(1))
    np.save(tmp_path / "z.npy", np.ones((2, 3), dtype=np.float32))
    spec = section(samples=4, inputs={"y": {"file": "inputs.npz", "key": "y"}, "z": {"file": "z.npy"}})
    specs = {"y": {"shape": [2, 3], "dtype": "float32"}, "z": {"shape": [2, 3], "dtype": "float32"}}
    samples = generate_inputs(spec, specs, tmp_path)
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(sample["y"], stack[i % 3].astype(np.float32))
        assert sample["y"].dtype == np.float32
        np.testing.assert_array_equal(sample["z"], np.ones((2, 3)))


def test_file_errors_name_field_and_file(tmp_path):
    np.savez(tmp_path / "inputs.npz", a=np.zeros((2, 3)))
    specs = {"y": {"shape": [2, 3], "dtype": "float32"}}
    with pytest.raises(UsageError, match=r"validate.inputs.y.key: .*inputs.npz has no array 'y'"):
        generate_inputs(section(inputs={"y": {"file": "inputs.npz"}}), specs, tmp_path)
    with pytest.raises(UsageError, match=r"validate.inputs.y.file: .*missing.npy does not exist"):
        generate_inputs(section(inputs={"y": {"file": "missing.npy"}}), specs, tmp_path)
    np.save(tmp_path / "wrong.npy", np.zeros((4, 4)))
    with pytest.raises(UsageError, match=r"shape \[4, 4\]"):
        generate_inputs(section(inputs={"y": {"file": "wrong.npy"}}), specs, tmp_path)
    np.save(tmp_path / "floats.npy", np.zeros((2, 3)))
    with pytest.raises(UsageError, match="float64"):
        generate_inputs(section(inputs={"y": {"file": "floats.npy"}}), {"y": {"shape": [2, 3], "dtype": "int64"}}, tmp_path)


# -- images ---------------------------------------------------------------------------------

def test_npy_images_normalised_nchw(tmp_path):
    folder = tmp_path / "samples"
    folder.mkdir()
    rng = np.random.default_rng(0)
    pictures = [rng.integers(0, 256, size=(4, 4, 3)).astype(np.uint8) for _ in range(2)]
    for i, picture in enumerate(pictures):
        np.save(folder / f"img{i}.npy", picture)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    spec = section(samples=3, inputs={"img": {"images": {"dir": "samples", "mean": mean, "std": std}}})
    samples = generate_inputs(spec, {"img": {"shape": [1, 3, 4, 4], "dtype": "float32"}}, tmp_path)
    for i, sample in enumerate(samples):
        expected = ((pictures[i % 2] / 255.0 - mean) / std).transpose(2, 0, 1)[None]
        np.testing.assert_allclose(sample["img"], expected, rtol=1e-6)


def test_images_resized_and_nhwc(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    np.save(folder / "a.npy", np.full((8, 6), 51.0))  # grayscale, other size
    spec = section(samples=1, inputs={"img": {"images": {"dir": "imgs", "layout": "nhwc", "size": [4, 4]}}})
    [sample] = generate_inputs(spec, {"img": {"shape": [1, 4, 4, 3], "dtype": "float32"}}, tmp_path)
    np.testing.assert_allclose(sample["img"], np.full((1, 4, 4, 3), 0.2), rtol=1e-6)


def test_image_errors(tmp_path):
    specs = {"img": {"shape": [1, 3, 4, 4], "dtype": "float32"}}
    with pytest.raises(UsageError, match=r"validate.inputs.img.images.dir: .*nowhere is not a folder"):
        generate_inputs(section(inputs={"img": {"images": {"dir": "nowhere"}}}), specs, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no images"):
        generate_inputs(section(inputs={"img": {"images": {"dir": "empty"}}}), specs, tmp_path)


def test_png_without_pillow_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes "from PIL import Image" fail
    folder = tmp_path / "pngs"
    folder.mkdir()
    (folder / "cat.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(UsageError, match=r"cat.png is .png but Pillow is not installed"):
        generate_inputs(section(inputs={"img": {"images": {"dir": "pngs"}}}), {"img": {"shape": [1, 3, 4, 4], "dtype": "float32"}}, tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("PIL") is None, reason="Pillow is not installed")
def test_png_decoded_with_pillow(tmp_path):
    from PIL import Image

    folder = tmp_path / "pngs"
    folder.mkdir()
    pixels = np.random.default_rng(3).integers(0, 256, size=(4, 4, 3)).astype(np.uint8)
    Image.fromarray(pixels).save(folder / "a.png")
    spec = section(samples=1, inputs={"img": {"images": {"dir": "pngs", "scale": 1.0}}})
    [sample] = generate_inputs(spec, {"img": {"shape": [1, 3, 4, 4], "dtype": "float32"}}, tmp_path)
    np.testing.assert_array_equal(sample["img"][0], pixels.transpose(2, 0, 1).astype(np.float32))


def test_samples_are_drawn_lazily_in_the_same_order_and_errors_come_first(tmp_path):
    import itertools

    from edgebuild.verify.inputs import iter_inputs

    specs = {"input_ids": {"shape": [1, 16], "dtype": "int64"}, "attention_mask": {"shape": [1, 16], "dtype": "int64"},
             "x": {"shape": [2, 3], "dtype": "float32"}}
    inputs = {"input_ids": {"tokens": {"vocab_size": 50}}, "x": {"random": {"distribution": "normal", "low": -1}}}
    # more samples than a recipe may ask for (MAX_SAMPLES): set past validation, as code could
    endless = ValidateSection.model_validate({"samples": 3, "inputs": inputs}).model_copy(update={"samples": 10**9})
    first = list(itertools.islice(iter_inputs(endless, specs, tmp_path), 3))  # a list of 10**9 would not fit
    expected = generate_inputs(ValidateSection.model_validate({"samples": 3, "inputs": inputs}), specs, tmp_path)
    for got, want in zip(first, expected, strict=True):
        assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
    bad = ValidateSection.model_validate({"samples": 2, "inputs": {"n": {"random": {}}}})
    with pytest.raises(UsageError, match="needs 'high'"):
        iter_inputs(bad, {"n": {"shape": [2], "dtype": "int32"}}, tmp_path)  # raised before any sample is drawn
