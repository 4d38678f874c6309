"""MIL ops that only move data: reshape, transpose, concat/split/stack, squeeze, tile, ...."""

from __future__ import annotations

import numpy as np

from .registry import evaluates


def _ints(value) -> list[int]:
    return [int(v) for v in np.atleast_1d(value)]


def resolve_reshape(in_shape: tuple[int, ...], shape: list[int]) -> list[int]:
    """Apply MIL reshape's ``0`` and ``-1`` rules (iOS17 form, a superset of iOS15's).

    A ``0`` copies the input dim at the same position counted from the right, or becomes 1
    when there is none; a single ``-1`` takes whatever size is left.
    """
    rank, out = len(in_shape), list(shape)
    for i, dim in enumerate(shape):
        if dim == 0:
            j = rank - (len(shape) - i)
            out[i] = in_shape[j] if j >= 0 else 1
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(in_shape)) // known if known else 0
    return out


@evaluates("reshape")
def reshape(op, x):
    value = np.asarray(x["x"])
    return value.reshape(resolve_reshape(value.shape, _ints(x["shape"])))


@evaluates("reshape_like")
def reshape_like(op, x):
    shape: list[int] = []
    for ref, begin, end, end_mask in zip(x["ref_tensors"], x["begins"], x["ends"], x["end_masks"]):
        dims = np.shape(ref)
        shape.extend(dims[int(begin) :] if bool(end_mask) else dims[int(begin) : int(end)])
    return np.reshape(x["x"], shape)


@evaluates("transpose")
def transpose(op, x):
    return np.transpose(x["x"], _ints(x["perm"]))


@evaluates("concat")
def concat(op, x):
    values = [np.asarray(v) for v in x["values"]]
    axis = int(x["axis"])
    if values[0].ndim == 0:  # MIL's type inference makes scalars a vector, one element each
        return np.stack(values)
    if not bool(x.get("interleave", False)):
        return np.concatenate(values, axis=axis)
    axis = axis % values[0].ndim
    # Interleaving = stacking right after ``axis``, then merging the two axes.
    stacked = np.stack(values, axis=axis + 1)
    merged = list(values[0].shape)
    merged[axis] *= len(values)
    return stacked.reshape(merged)


@evaluates("split")
def split(op, x):
    value, axis = np.asarray(x["x"]), int(x["axis"])
    sizes = x.get("split_sizes")
    if sizes is None:
        return tuple(np.split(value, int(x["num_splits"]), axis=axis))
    cuts = np.cumsum(_ints(sizes))[:-1]
    return tuple(np.split(value, cuts, axis=axis))


@evaluates("stack")
def stack(op, x):
    return np.stack(x["values"], axis=int(x["axis"]))


@evaluates("squeeze")
def squeeze(op, x):
    axes = x.get("axes")
    value = np.asarray(x["x"])
    return np.squeeze(value) if axes is None else np.squeeze(value, axis=tuple(_ints(axes)))


@evaluates("expand_dims")
def expand_dims(op, x):
    value = np.asarray(x["x"])
    out_rank = value.ndim + len(_ints(x["axes"]))
    axes = sorted(a % out_rank for a in _ints(x["axes"]))
    return np.expand_dims(value, axis=tuple(axes))


@evaluates("tile")
def tile(op, x):
    return np.tile(x["x"], _ints(x["reps"]))


@evaluates("flatten2d")
def flatten2d(op, x):
    value = np.asarray(x["x"])
    axis = int(x.get("axis", 1))
    axis = axis + value.ndim if axis < 0 else axis
    return value.reshape(int(np.prod(value.shape[:axis])), int(np.prod(value.shape[axis:])))


@evaluates("reverse")
def reverse(op, x):
    axes = x.get("axes")
    return np.flip(x["x"], axis=None if axes is None else tuple(_ints(axes)))


@evaluates("reverse_sequence")
def reverse_sequence(op, x):
    value = np.asarray(x["x"])
    seq_axis = int(x.get("seq_axis", 0)) % value.ndim
    batch_axis = int(x.get("batch_axis", 0)) % value.ndim
    lengths = np.asarray(x["lengths"]).astype(np.int64)[:, None]
    positions = np.arange(value.shape[seq_axis])[None, :]
    # Source position for each (batch, seq) pair: mirrored inside the length, kept after it.
    source = np.where(positions < lengths, lengths - 1 - positions, positions)
    if batch_axis > seq_axis:
        source = source.T
    index_shape = [1] * value.ndim
    index_shape[batch_axis] = value.shape[batch_axis]
    index_shape[seq_axis] = value.shape[seq_axis]
    source = np.broadcast_to(source.reshape(index_shape), value.shape)
    return np.take_along_axis(value, source, axis=seq_axis)


@evaluates("sliding_windows")
def sliding_windows(op, x):
    value = np.asarray(x["x"])
    axis = int(x["axis"]) % value.ndim
    size, stride = int(x["size"]), int(x.get("stride", 1))
    windows = np.lib.stride_tricks.sliding_window_view(value, size, axis=axis)
    windows = np.moveaxis(windows, -1, axis + 1)
    picked = [slice(None)] * windows.ndim
    picked[axis] = slice(None, None, stride)
    return np.ascontiguousarray(windows[tuple(picked)])


@evaluates("space_to_batch")
def space_to_batch(op, x):
    value = np.asarray(x["x"])
    (bh, bw), pads = _ints(x["block_shape"]), np.asarray(x["paddings"]).astype(int)
    value = np.pad(value, [(0, 0), (0, 0), tuple(pads[0]), tuple(pads[1])])
    n, c, h, w = value.shape
    blocks = value.reshape(n, c, h // bh, bh, w // bw, bw)
    # Block offsets become the outer batch index (TensorFlow's space_to_batch_nd order).
    return blocks.transpose(3, 5, 0, 1, 2, 4).reshape(bh * bw * n, c, h // bh, w // bw)


@evaluates("batch_to_space")
def batch_to_space(op, x):
    value = np.asarray(x["x"])
    (bh, bw), crops = _ints(x["block_shape"]), np.asarray(x["crops"]).astype(int)
    n, c, h, w = value.shape
    out_n = n // (bh * bw)
    spatial = value.reshape(bh, bw, out_n, c, h, w).transpose(2, 3, 4, 0, 5, 1)
    spatial = spatial.reshape(out_n, c, h * bh, w * bw)
    return spatial[
        :, :, crops[0][0] : h * bh - crops[0][1], crops[1][0] : w * bw - crops[1][1]
    ]


@evaluates("identity")
def identity(op, x):
    return x["x"]
