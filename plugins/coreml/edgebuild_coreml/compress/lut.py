"""A ``lut_function`` for coremltools' custom palettisation, backed by our fast k-means.

In a compression config it also marks the weights ``fast_palettize`` takes over; coremltools'
pass only calls it where that pass does not apply (joint compression, per-channel scales).
There coremltools calls ``lut_function`` once per channel group, one group after another. To use
both cores and cluster all groups of a tensor in one vectorised call, ``prepare`` clusters
every weight the pass will see ahead of time and the function then serves results by the
content of the array it is handed; anything not prepared is clustered on the spot.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from edgebuild.plugin import cpu_threads

from .kmeans1d import kmeans1d, palettize_groups


class KmeansLutFunction:
    """Callable ``(weight) -> (lut [2^nbits], indices uint8 flat)`` for ``mode="custom"``."""

    def __init__(self, nbits: int):
        self.nbits = nbits
        self._prepared: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        weight = np.ascontiguousarray(weight)
        found = self._prepared.pop(_digest(weight), None)
        if found is None:
            centroids, labels = kmeans1d(weight.reshape(-1), 1 << self.nbits)
            found = centroids, labels
        centroids, labels = found
        return _as_weight_dtype(centroids, weight.dtype), labels.reshape(-1).astype(np.uint8)

    def prepare(self, grouped_weights: list[np.ndarray]) -> None:
        """Cluster ahead of time; each item is [groups, group elements] in coremltools' order."""
        if not grouped_weights:
            return
        k = 1 << self.nbits

        def cluster(rows: np.ndarray) -> None:
            luts, labels = palettize_groups(rows, k, workers=1)
            for row, lut, row_labels in zip(rows, luts, labels):
                self._prepared[_digest(row)] = (lut, row_labels)

        workers = min(cpu_threads(), len(grouped_weights))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(cluster, grouped_weights))


def channel_groups(weight: np.ndarray, channel_axis: int, group_size: int) -> np.ndarray | None:
    """[groups, elements] as coremltools splits a weight (channel axis first, then C order)."""
    channels = weight.shape[channel_axis]
    if group_size == 0:
        group_size = channels
    if channels % group_size:
        return None
    moved = np.swapaxes(weight, 0, channel_axis) if channel_axis else weight
    return np.ascontiguousarray(moved).reshape(channels // group_size, -1)


def _digest(array: np.ndarray) -> bytes:
    contiguous = np.ascontiguousarray(array)
    header = f"{contiguous.dtype.str}{contiguous.size}".encode()
    return hashlib.blake2b(header + contiguous.data.tobytes(), digest_size=16).digest()


def _as_weight_dtype(centroids: np.ndarray, dtype: np.dtype) -> np.ndarray:
    # Joint compression palettises integer (already quantised) weights: round, do not truncate.
    if np.issubdtype(dtype, np.integer):
        centroids = np.rint(centroids)
    return centroids.astype(dtype)
