"""fp32 weights cast to fp16 once each, for the fp16 cast pass, with its overflow check on the result.

coremltools' cast pass reads every fp32 weight twice: once to check that it fits fp16 (a scan of
|x| over the whole constant, for each reader), once more to compute its ``cast`` op's value. Here
a weight is cast when the pass first checks it, in chunks on two threads (numpy releases the GIL),
and the fp16 result is checked for inf as it is made: a weight without any fits. Only a weight
that became inf is scanned in fp32, to tell values meant as infinity (an attention mask from
float32's min, which may become fp16's inf) from real ones out of range. The ``cast`` op the pass
then makes for the weight takes the fp16 array already made as its value.

numpy converts fp32 to fp16 one element at a time (about 0.6 GB/s of fp32 here, F16C or not);
PyTorch's vectorised cast is 5-15x faster. A program with hundreds of MB of weights casts through
torch when the process has imported it, and one with gigabytes (a decoder) imports it when it is
installed (``half_caster``): its import, 2-3 s, is repaid above ``TORCH_WORTH_BYTES``. Both give
the same bits.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import sys
import warnings
from contextlib import contextmanager

import numpy as np
from coremltools.converters.mil.mil.ops.defs.iOS15.elementwise_unary import cast as cast_op

from edgebuild_coreml.memory import drop_mapped_pages

MIN_ELEMENTS = 4096  # smaller constants: coremltools' own check and cast are as cheap
CHUNK_ELEMENTS = 1 << 22  # 16 MB of fp32 per step
THREADS = 2
TORCH_MIN_BYTES = 256 << 20  # fp32 weights to cast from which torch casts them, once imported
TORCH_WORTH_BYTES = 2 << 30  # fp32 weights to cast above which importing torch pays for itself
BAND_ROWS = 256  # rows of a transposed matrix's source cast per step by torch: a band stays in cache


def half_caster(weight_bytes: int):
    """The torch module when it should cast ``weight_bytes`` of fp32 weights to fp16: at least
    ``TORCH_MIN_BYTES`` (below, its first calls' set-up costs more than numpy's casts), and torch
    already imported, or importable and worth importing for that many bytes; else None (numpy)."""
    if weight_bytes < TORCH_MIN_BYTES:
        return None
    torch = sys.modules.get("torch")
    if torch is None and weight_bytes >= TORCH_WORTH_BYTES:
        try:
            import torch
        except ImportError:
            return None
    return torch


def cast_checked(value: np.ndarray, torch=None) -> tuple[np.ndarray, bool]:
    """(``value`` as fp16, whether any element became inf): in C order when ``value`` is a
    transposed matrix (a MatMul's [K, N] initializer as ``linear``'s [N, K] weight: see
    ``in_c_order``), else in ``value``'s own layout. ``torch``: cast through it (``half_caster``)."""
    if torch is not None and value.size >= MIN_ELEMENTS and (_transposed_matrix(value) or value.flags.c_contiguous):
        return _torch_cast_checked(value, torch)
    if _transposed_matrix(value):
        out = in_c_order(value, np.float16)
        return out, bool(np.isinf(out).any())
    out = np.empty_like(value, dtype=np.float16)  # order K: the source's layout
    source, target = np.ravel(value, order="K"), np.ravel(out, order="K")
    if not (np.shares_memory(source, value) and np.shares_memory(target, out)):  # not a dense layout
        with np.errstate(over="ignore"):
            out = value.astype(np.float16)
        return out, bool(np.isinf(out).any())

    def cast(start: int) -> bool:
        chunk = target[start:start + CHUNK_ELEMENTS]
        with np.errstate(over="ignore"):  # inf is what the check below looks for
            np.copyto(chunk, source[start:start + CHUNK_ELEMENTS], casting="unsafe")
        return bool(np.isinf(chunk).any())

    starts = range(0, source.size, CHUNK_ELEMENTS)
    if len(starts) == 1:
        return out, cast(0)
    with ThreadPoolExecutor(THREADS) as pool:
        return out, any(list(pool.map(cast, starts)))


def _torch_cast_checked(value: np.ndarray, torch) -> tuple[np.ndarray, bool]:
    """``cast_checked`` through torch, for a C-ordered array (in chunks of ``CHUNK_ELEMENTS``) or a
    transposed matrix (by bands of ``BAND_ROWS`` rows of its [K, N] source: each band cast
    contiguously, then stored transposed), the pieces on ``THREADS`` threads of ours.

    torch's own intra-op threads would split each piece and meet at its end; on a loaded machine
    the first to arrive spins while the other waits for a core (4-5x the CPU time of the cast, and
    slower), so each piece is cast on one torch thread and ours wait on locks instead. The result
    is torch's allocation (numpy's, with its huge-page advice, faulted in at half the speed here)."""
    transposed = _transposed_matrix(value)
    with warnings.catch_warnings():  # a read-only (mapped) weight: torch warns, though it only reads
        warnings.simplefilter("ignore", UserWarning)
        source = torch.from_numpy(value.T if transposed else value)
    out = torch.empty(value.shape, dtype=torch.float16)
    if transposed:
        target, step = out.t(), BAND_ROWS  # [K, N] views, cut along K
    else:
        source, target, step = source.reshape(-1), out.reshape(-1), CHUNK_ELEMENTS

    def cast(start: int) -> None:
        target[start:start + step].copy_(source[start:start + step])  # to fp16 as ``.to`` rounds

    starts = range(0, source.shape[0], step)
    with _one_intra_op_thread(torch), ThreadPoolExecutor(min(THREADS, len(starts))) as pool:
        list(pool.map(cast, starts))
    return out.numpy(), _has_inf(out, torch)


@contextmanager
def _one_intra_op_thread(torch):
    """Within: torch runs each op on the calling thread (a process-wide setting, restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _has_inf(half, torch) -> bool:
    """Whether the fp16 tensor ``half`` holds an inf: one pass for its extremes (``isinf().any()``
    makes a boolean tensor first, several times slower), unless it holds a NaN."""
    low, high = torch.aminmax(half.reshape(-1))
    if torch.isnan(low) or torch.isnan(high):
        return bool(torch.isinf(half).any())
    return bool(torch.isinf(low) or torch.isinf(high))


TILE = 256  # rows and columns of a tile: a tile of the source and of the result stay in cache


def _transposed_matrix(value: np.ndarray) -> bool:
    return value.ndim == 2 and value.flags.f_contiguous and not value.flags.c_contiguous and value.size >= MIN_ELEMENTS


def in_c_order(value: np.ndarray, dtype=None) -> np.ndarray:
    """``value`` (a 2-D array) as a C-order array of ``dtype`` (its own by default), copied a
    tile at a time on two threads. The weight file stores C order; numpy's own copy of a
    transposed matrix walks the source a column at a time, several times slower on a wide one
    (an embedding table or LM head: 0.75 s for 125 MB of fp16)."""
    out = np.empty(value.shape, dtype or value.dtype)
    rows, cols = value.shape

    def band(start: int) -> None:
        with np.errstate(over="ignore"):  # an fp16 cast's inf is for the caller to find
            for col in range(0, cols, TILE):
                np.copyto(out[start:start + TILE, col:col + TILE], value[start:start + TILE, col:col + TILE],
                          casting="unsafe")

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(band, range(0, rows, TILE)))
    return out


class WeightCasts:
    """The fp16 values of the large fp32 constants the cast pass checked, until their casts take them."""

    def __init__(self, weight_bytes: int = 0) -> None:
        self._torch = half_caster(weight_bytes)  # ``weight_bytes``: of the fp32 weights to cast
        self._checked: dict[int, tuple[object, bool]] = {}  # id(var) -> (var, out of fp16's range)
        self._made: dict[int, tuple[object, np.ndarray]] = {}  # id(var) -> (var, fp16 value)

    def overflows(self, var) -> bool:
        """Whether the fp32 constant ``var`` holds a real value fp16 cannot (cast once, on first ask)."""
        known = self._checked.get(id(var))
        if known is not None and known[0] is var:
            return known[1]
        value = np.asarray(var.val)
        fp16, became_inf = cast_checked(value, self._torch)
        overflow = became_inf and _out_of_range(value)
        self._checked[id(var)] = (var, overflow)
        if not overflow:
            self._made[id(var)] = (var, fp16)
        drop_mapped_pages([value])  # a lowered weight viewing its mapped initializer: read once
        return overflow

    def take(self, var) -> np.ndarray | None:
        """The fp16 value made for ``var``, handed over once."""
        made = self._made.pop(id(var), None)
        return made[1] if made is not None and made[0] is var else None

    @contextmanager
    def serving_casts(self):
        """Within: a ``cast`` to fp16 of a constant checked here takes the value made, not a new one.
        (A class attribute of coremltools' op, restored after; the lower stages that run coremltools'
        passes take turns, see ``Stage.extra["exclusive"]``.)"""
        original = cast_op.__dict__["get_cast_value"]
        casts = self

        def get_cast_value(cls, input_var, dtype_val):
            if dtype_val == "fp16":
                made = casts.take(input_var)
                if made is not None:
                    return made
            return original.__func__(cls, input_var, dtype_val)

        cast_op.get_cast_value = classmethod(get_cast_value)
        try:
            yield self
        finally:
            cast_op.get_cast_value = original
            self._checked.clear()
            self._made.clear()


def _out_of_range(value: np.ndarray) -> bool:
    """Whether fp32 ``value`` holds a real (not meant as infinite) value beyond fp16's range."""
    from edgebuild_coreml.fp16_guard import FP16_MAX, MEANT_AS_INFINITY, max_finite_magnitude

    return max_finite_magnitude(value, below=MEANT_AS_INFINITY) > FP16_MAX
