"""Sample inputs for validation, built from the recipe's ``validate.inputs``.

Every sample is a ``{input name: array}`` dict with the shape and dtype the model declares.
Random streams are seeded with ``(seed, crc32(input name))`` so two inputs sharing a seed still
get different data (swapped inputs would otherwise go unnoticed), and the same recipe always
yields the same samples.

Inputs the recipe does not mention get defaults: float and bool inputs uniform random values
in ``[0, 1)``; ``attention_mask`` / ``token_type_ids`` follow the model's ``tokens`` input
(ones on real tokens / zeros). Any other integer input must be described in the recipe, since
random integers are rarely valid indices.

No sample holds NaN: with NaN fed in, reference and candidate both compute NaN and validation
would prove nothing, so a file, folder or value that gives one is refused (exit 2). Infinities
are kept: an additive attention mask takes -inf, and the outputs' NaN/inf are judged on their own
(``verify.thresholds``).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from edgebuild.errors import UsageError
from edgebuild.recipe.validation import (
    ImagesInput,
    InputSource,
    RandomInput,
    TokensInput,
    ValidateSection,
)
from edgebuild.verify.files import IMAGE_SUFFIXES, image_files

MASK_INPUT = "attention_mask"
TOKEN_TYPE_INPUT = "token_type_ids"

Sample = dict[str, np.ndarray]


def generate_inputs(spec: ValidateSection, input_specs: Mapping[str, Mapping[str, Any]], base_dir: Path) -> list[Sample]:
    """Every sample of ``iter_inputs`` at once."""
    return list(iter_inputs(spec, input_specs, base_dir))


def iter_inputs(spec: ValidateSection, input_specs: Mapping[str, Mapping[str, Any]], base_dir: Path) -> Iterator[Sample]:
    """One ``{name: array}`` dict per sample (``spec.samples`` of them).

    ``input_specs`` maps each model input to ``{"shape": [ints], "dtype": str}``; relative file
    and folder paths in the recipe are resolved against ``base_dir`` (the recipe's folder).
    """
    base_dir = Path(base_dir)
    shapes = {name: _fixed_shape(name, info.get("shape")) for name, info in input_specs.items()}
    dtypes = {name: np.dtype(info.get("dtype", "float32")) for name, info in input_specs.items()}
    for name, source in spec.inputs.items():
        if name not in input_specs and source.kind != "value":
            known = ", ".join(input_specs) or "none"
            raise UsageError(f"validate.inputs.{name}: the model has no input '{name}' (inputs: {known})")

    columns: dict[str, Iterable] = {}
    tokens_input: str | None = None  # the token input whose real-token masks companions follow
    for name, source in spec.inputs.items():
        field = f"validate.inputs.{name}"
        shape, dtype = shapes.get(name), dtypes.get(name)
        if source.kind == "random":
            columns[name] = _random(field, source.random, name, shape, dtype, spec.samples)
        elif source.kind == "tokens":
            columns[name] = _tokens(field + ".tokens", source.tokens, name, shape, dtype, spec.samples)
            tokens_input = tokens_input or name
        elif source.kind == "value":
            columns[name] = [_value(field, source.value, shape, dtype)] * spec.samples
        elif source.kind == "images":
            columns[name] = _images(field + ".images", source.images, shape, dtype, spec.samples, base_dir)
        else:
            columns[name] = _from_file(field, source, name, shape, dtype, spec.samples, base_dir)

    companions: dict[str, tuple] = {}
    for name in input_specs:
        if name in columns:
            continue
        shape, dtype = shapes[name], dtypes[name]
        if name in (MASK_INPUT, TOKEN_TYPE_INPUT) and tokens_input is not None:
            _check_companion(name, shape, shapes[tokens_input])
            companions[name] = (shape, dtype)
        elif dtype.kind in "fb":
            columns[name] = _random(f"validate.inputs.{name}", RandomInput(), name, shape, dtype, spec.samples)
        else:
            raise UsageError(
                f"validate.inputs.{name}: the model input '{name}' is {dtype.name}; random values are rarely valid ids",
                hint=f"describe it under validate.inputs.{name} (tokens, random with low/high, value or file); "
                     "for `edgebuild verify`, in a YAML file given with --inputs",
            )
    order = [name for name in (*spec.inputs, *input_specs) if name in columns or name in companions]
    fields = {name: f"validate.inputs.{name}" + (f".{spec.inputs[name].kind}" if name in spec.inputs else "")
              for name in order}
    return _without_nan(_zip_samples(columns, tokens_input, companions, dict.fromkeys(order), spec.samples), fields)


def _without_nan(samples: Iterator[Sample], fields: Mapping[str, str]) -> Iterator[Sample]:
    """``samples``, refusing the first that holds a NaN (see the module docstring)."""
    for index, sample in enumerate(samples, 1):
        for name, array in sample.items():
            if array.dtype.kind in "fc":
                nans = int(np.count_nonzero(np.isnan(array)))
                if nans:
                    raise UsageError(
                        f"{fields[name]}: validation inputs contain NaN ({nans} of {array.size} values of input "
                        f"'{name}' in sample {index}); with NaN fed in, both sides compute NaN and the comparison "
                        "proves nothing",
                        hint="give finite values (inf is kept, e.g. an additive mask's -inf)")
        yield sample


def _zip_samples(columns: dict, tokens_input: str | None, companions: dict, order: dict, samples: int) -> Iterator[Sample]:
    """One sample at a time from per-input streams (token streams yield (ids, mask) pairs)."""
    streams = {name: iter(column) for name, column in columns.items()}
    for _ in range(samples):
        sample, masks = {}, {}
        for name, stream in streams.items():
            value = next(stream)
            if isinstance(value, tuple):
                value, masks[name] = value
            sample[name] = value
        for name, (shape, dtype) in companions.items():
            mask = masks[tokens_input]
            sample[name] = (mask if name == MASK_INPUT else np.zeros_like(mask)).astype(dtype)
        yield {name: sample[name] for name in order}


def _fixed_shape(name: str, shape) -> tuple[int, ...]:
    if shape is None or any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) for d in shape):
        raise UsageError(
            f"source.inputs.{name}.shape: validation needs a fixed shape, got {shape!r}",
            hint="pin every dimension to an integer (or give a default for ranged ones)",
        )
    return tuple(int(d) for d in shape)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _random(field: str, cfg: RandomInput, name: str, shape, dtype: np.dtype, samples: int) -> Iterator[np.ndarray]:
    """Checks the config now; draws each sample when it is asked for (same stream either way)."""
    rng = _rng(cfg.seed, name)
    if dtype.kind == "b":
        return (rng.random(shape) < 0.5 for _ in range(samples))
    if dtype.kind in "iu":
        if cfg.high is None:
            raise UsageError(f"{field}.random: integer input '{name}' needs 'high' (exclusive upper bound)")
        low = int(cfg.low if cfg.low is not None else 0)
        high = int(cfg.high)
        if cfg.distribution == "uniform":
            if high <= low:
                raise UsageError(f"{field}.random: high ({high}) must exceed low ({low}) for integers")
            return (rng.integers(low, high, size=shape).astype(dtype) for _ in range(samples))
        return (np.clip(np.rint(cfg.mean + cfg.std * rng.standard_normal(shape)), low, high - 1).astype(dtype)
                for _ in range(samples))
    if cfg.distribution == "uniform":
        low = cfg.low if cfg.low is not None else 0.0
        high = cfg.high if cfg.high is not None else 1.0
        return (rng.uniform(low, high, size=shape).astype(dtype) for _ in range(samples))
    clipped = cfg.low is not None or cfg.high is not None
    draws = (cfg.mean + cfg.std * rng.standard_normal(shape) for _ in range(samples))
    return ((np.clip(d, cfg.low, cfg.high) if clipped else d).astype(dtype) for d in draws)


def _tokens(field: str, cfg: TokensInput, name: str, shape, dtype: np.dtype, samples: int):
    """Rows of ``[first] ids... [last] pad...`` with each sample's real-token mask, as
    ``(ids, mask)`` pairs drawn when asked for. A row too short for a token between the specials
    (a flexible length at its smallest) holds the specials that fit."""
    if dtype.kind not in "iu":
        raise UsageError(f"{field}: input '{name}' is {dtype.name}; token ids need an integer input")
    length = shape[-1] if shape else 0
    if cfg.length is not None and cfg.length != length:
        raise UsageError(f"{field}.length: {cfg.length} differs from the input's last dimension {length}")
    specials = [t for t in (cfg.special.first, cfg.special.last) if t is not None]
    if cfg.real_tokens is not None and not len(specials) < cfg.real_tokens <= length:
        raise UsageError(f"{field}.real_tokens: must be in ({len(specials)}, {length}], got {cfg.real_tokens}")
    # Draw ordinary ids from the vocabulary minus pad and the specials, so they never collide.
    excluded = sorted({cfg.pad, *specials} & set(range(cfg.vocab_size)))
    if cfg.vocab_size - len(excluded) < 1:
        raise UsageError(f"{field}.vocab_size: {cfg.vocab_size} leaves no ids besides pad and specials")
    rng = _rng(cfg.seed, name)
    rows_per_sample = int(np.prod(shape[:-1], dtype=np.int64))
    return _token_rows(cfg, rng, rows_per_sample, length, specials, excluded, shape, dtype, samples)


def _token_rows(cfg: TokensInput, rng, rows_per_sample: int, length: int, specials: list, excluded: list,
                shape, dtype: np.dtype, samples: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for _ in range(samples):
        ids = np.full((rows_per_sample, length), cfg.pad, dtype=np.int64)
        mask = np.zeros((rows_per_sample, length), dtype=np.int64)
        for row in range(rows_per_sample):
            if length <= len(specials):  # too short for a token between the specials: keep what fits
                ids[row, :] = specials[:length]
                mask[row, :] = 1
                continue
            real = cfg.real_tokens or int(rng.integers(max(length // 2, len(specials) + 1), length + 1))
            body = rng.integers(0, cfg.vocab_size - len(excluded), size=real - len(specials))
            for value in excluded:
                body += body >= value
            pieces = [[cfg.special.first]] if cfg.special.first is not None else []
            pieces += [body] + ([[cfg.special.last]] if cfg.special.last is not None else [])
            ids[row, :real] = np.concatenate(pieces)
            mask[row, :real] = 1
        yield ids.reshape(shape).astype(dtype), mask.reshape(shape)


def _check_companion(name: str, shape, tokens_shape) -> None:
    """attention_mask / token_type_ids follow the token input, so they need its shape."""
    if tuple(shape) != tuple(tokens_shape):
        raise UsageError(
            f"validate.inputs.{name}: shape {list(shape)} does not match the token input's {list(tokens_shape)}",
            hint=f"describe '{name}' under validate.inputs explicitly",
        )


def _value(field: str, value, shape, dtype) -> np.ndarray:
    if shape is None:  # not a runtime input of the model (e.g. folded at build time)
        array = np.asarray(value)
        return array.astype(np.float32) if array.dtype.kind == "f" else array
    try:
        return np.broadcast_to(np.asarray(value, dtype=dtype), shape).copy()
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{field}.value: cannot make a {dtype.name} array of shape {list(shape)} from {value!r} ({exc})") from None


def _from_file(field: str, source: InputSource, name: str, shape, dtype, samples: int, base_dir: Path) -> list[np.ndarray]:
    """A ``.npy``/``.npz`` array: either exactly the input's shape (used for every sample) or a
    stack of them along a new first axis (sample i takes entry ``i % len``)."""
    path = base_dir / source.file
    if not path.is_file():
        raise UsageError(f"{field}.file: {path} does not exist")
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types for a bad file
        raise UsageError(f"{field}.file: cannot read {path} as .npy/.npz ({exc})") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        key = source.key or name
        with loaded:
            if key not in loaded.files:
                raise UsageError(f"{field}.key: {path} has no array '{key}' (arrays: {', '.join(loaded.files)})")
            array = loaded[key]
    else:
        array = loaded
    if array.dtype != dtype and not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise UsageError(f"{field}.file: {path} holds {array.dtype.name}, the input '{name}' is {dtype.name}")
    array = array.astype(dtype, copy=False)
    if array.shape == shape:
        return [array] * samples
    if array.ndim == len(shape) + 1 and array.shape[1:] == shape and array.shape[0] > 0:
        return [array[i % array.shape[0]] for i in range(samples)]
    raise UsageError(
        f"{field}.file: array in {path} has shape {list(array.shape)}; input '{name}' needs {list(shape)} "
        f"or [N, {', '.join(map(str, shape))}]"
    )


def _images(field: str, cfg: ImagesInput, shape, dtype: np.dtype, samples: int, base_dir: Path) -> Iterator[np.ndarray]:
    """Images from a folder, one per batch entry, cycling when there are fewer than needed."""
    if len(shape) != 4:
        raise UsageError(f"{field}: image inputs need a 4-d shape (batch, ...), got {list(shape)}")
    if cfg.layout == "nchw":
        batch, channels, height, width = shape
    else:
        batch, height, width, channels = shape
    if cfg.size is not None and tuple(cfg.size) != (height, width):
        raise UsageError(f"{field}.size: {list(cfg.size)} differs from the input's height/width {[height, width]}")
    for stat in ("mean", "std"):
        values = getattr(cfg, stat)
        if values is not None and len(values) not in (1, channels):
            raise UsageError(f"{field}.{stat}: has {len(values)} entries, the input has {channels} channels")
    folder = base_dir / cfg.dir
    if not folder.is_dir():
        raise UsageError(f"{field}.dir: {folder} is not a folder")
    files = image_files(folder)
    if not files:
        raise UsageError(f"{field}.dir: {folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")

    mean = np.asarray(cfg.mean if cfg.mean is not None else [0.0], dtype=np.float64)
    std = np.asarray(cfg.std if cfg.std is not None else [1.0], dtype=np.float64)
    return _image_batches(field, cfg, files, (batch, channels, height, width), mean, std, dtype, samples)


def _image_batches(field: str, cfg: ImagesInput, files: list[Path], dims: tuple, mean, std, dtype: np.dtype,
                   samples: int) -> Iterator[np.ndarray]:
    batch, channels, height, width = dims
    for i in range(samples):
        batch_images = []
        for j in range(batch):
            path = files[(i * batch + j) % len(files)]
            pixels = _to_channels(field, path, _decode(field, path), channels)
            pixels = _resize_bilinear(pixels, height, width)
            batch_images.append((pixels / cfg.scale - mean) / std)
        stacked = np.stack(batch_images)  # N, H, W, C
        if cfg.layout == "nchw":
            stacked = stacked.transpose(0, 3, 1, 2)
        yield np.ascontiguousarray(stacked).astype(dtype)


def _decode(field: str, path: Path) -> np.ndarray:
    """Pixels as a float ``H x W x C`` (or ``H x W``) array."""
    if path.suffix.lower() == ".npy":
        try:
            return np.load(path, allow_pickle=False).astype(np.float64)
        except Exception as exc:
            raise UsageError(f"{field}.dir: cannot read image {path} ({exc})") from None
    try:
        from PIL import Image
    except ImportError:
        raise UsageError(
            f"{field}.dir: {path} is {path.suffix} but Pillow is not installed",
            hint="pip install pillow, or convert the images to .npy (H x W x C arrays)",
        ) from None
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB" if image.mode not in ("L", "I", "F") else image.mode), dtype=np.float64)
    except Exception as exc:
        raise UsageError(f"{field}.dir: cannot decode image {path} ({exc})") from None


def _to_channels(field: str, path: Path, pixels: np.ndarray, channels: int) -> np.ndarray:
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.ndim != 3:
        raise UsageError(f"{field}.dir: image {path} has shape {list(pixels.shape)}; expected H x W x C")
    have = pixels.shape[2]
    if have == channels:
        return pixels
    if have == 1:
        return np.repeat(pixels, channels, axis=2)
    if have == 4 and channels == 3:  # drop alpha
        return pixels[:, :, :3]
    if have == 3 and channels == 1:  # ITU-R BT.601 luma
        return (pixels @ np.array([0.299, 0.587, 0.114]))[:, :, None]
    raise UsageError(f"{field}.dir: image {path} has {have} channels, the input needs {channels}")


def _resize_bilinear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize with half-pixel centres (what PIL and most frameworks do for upscaling)."""
    in_h, in_w = pixels.shape[:2]
    if (in_h, in_w) == (height, width):
        return pixels

    def axis(n_out, n_in):
        pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, pos - lo

    y0, y1, fy = axis(height, in_h)
    x0, x1, fx = axis(width, in_w)
    top = pixels[y0][:, x0] * (1 - fx)[None, :, None] + pixels[y0][:, x1] * fx[None, :, None]
    bottom = pixels[y1][:, x0] * (1 - fx)[None, :, None] + pixels[y1][:, x1] * fx[None, :, None]
    return top * (1 - fy)[:, None, None] + bottom * fy[:, None, None]
