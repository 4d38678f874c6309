"""Saving a model whose weights are mostly unchanged without writing them again.

A decoder's weights are gigabytes; a pass over the graph (fusion, folding) leaves nearly all of
them as they were read: external tensors of the input's data file. Writing them one by one
through Python costs a mapped read and a write of every byte. Instead the output's data file is a
clone of the input's where the file system can (APFS, btrfs, XFS: no bytes written), else a
kernel-side copy (Linux's ``sendfile``: the bytes never enter the process; see
``edgebuild.store.links.clone_or_copy``), the untouched tensors keep their offsets in it, and only
tensors the passes made or changed go to a second file beside it.

A large source data file is not copied into the import stage's entry at all: the entry refers to
it by a symbolic link (``edgebuild.store.links.refer``), which later stages' entries repeat.

When the input is an earlier stage's output (``link=True``), the data file is not copied at all but
hard-linked to it: both are store files, sealed read-only, never written again. onnx_ir refuses to
map external data from a file with more than one link (against a hostile model that links a file
from elsewhere into its directory), so stage outputs are read with :func:`load_stage_model`, which
makes the same containment check itself (:func:`check_external_data`) and then maps them by
absolute path. A copy's digest is the input's: known already when the input is an earlier stage's
output, else hashed from the input while the kernel copies it; the store's scan of the output does
not read the gigabytes again either way.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx_ir as ir

from edgebuild.graph.external_data import check_external_data, iter_graphs, iter_tensors
from edgebuild.store import hashstate
from edgebuild.store.links import clone_or_copy, refer
from edgebuild.store.local import seal

EXTRA_SUFFIX = ".extra"  # the data file of new and changed tensors: <data file>.extra
MIN_REUSED_SHARE = 0.5  # below this share of the input file still referenced, write a fresh file
EMBED_MAX_BYTES = 1024  # smaller in-memory tensors stay in the proto, as ir.save would keep them


def _initializer_tensors(model: ir.Model) -> list[tuple[ir.Value, ir.TensorProtocol]]:
    return [(value, value.const_value) for graph in iter_graphs(model.graph)
            for value in graph.initializers.values() if value.const_value is not None]


def _same_file(tensor, data: Path) -> bool:
    if not isinstance(tensor, ir.ExternalTensor):
        return False
    try:
        return os.path.samefile(tensor.path, data)
    except OSError:
        return False


def save_reusing_data(model: ir.Model, target: Path, data_name: str, source_data: Path, *, link: bool = False,
                      copied: bool = False) -> bool:
    """Save ``model`` at ``target`` with ``target.parent / data_name`` a copy of ``source_data`` (a
    hard link with ``link``: ``source_data`` is an earlier stage's output; a reference to a large
    source file: ``edgebuild.store.links.refer``; already made with ``copied``: see ``copying``),
    which its unchanged external tensors keep pointing into; other
    tensors go to ``data_name + EXTRA_SUFFIX``. Returns False, writing nothing, when that does not
    apply (no such file, or less than ``MIN_REUSED_SHARE`` of it still referenced): save the usual
    way then."""
    source_data, target = Path(source_data), Path(target)
    if not source_data.is_file() or (target.parent / data_name).exists() != copied:
        return False
    tensors = _initializer_tensors(model)
    reused = sum(t.length or 0 for _, t in tensors if _same_file(t, source_data))
    if reused < MIN_REUSED_SHARE * source_data.stat().st_size:
        return False
    if any(isinstance(t, ir.ExternalTensor) and not _same_file(t, source_data) for _, t in tensors):
        return False  # tensors from a third file: the usual save gathers them
    held = {id(t) for _, t in tensors}
    if any(isinstance(t, ir.ExternalTensor) and id(t) not in held for t in iter_tensors(model)):
        return False  # an external attribute tensor: its location would not follow
    target.parent.mkdir(parents=True, exist_ok=True)
    data = target.parent / data_name
    if not copied and not (link and link_sealed(source_data, data)) and not refer(source_data, data):
        copy_vouched(source_data, data)
    extra_name = data_name + EXTRA_SUFFIX
    offset = 0
    with open(target.parent / extra_name, "wb") as extra:
        for value, tensor in tensors:
            if isinstance(tensor, ir.ExternalTensor):
                value.const_value = ir.ExternalTensor(
                    data_name, tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape, name=tensor.name,
                    doc_string=tensor.doc_string, metadata_props=tensor.metadata_props, base_dir=target.parent)
                continue
            if tensor.nbytes <= EMBED_MAX_BYTES:
                continue
            raw = tensor.tobytes()
            extra.write(raw)
            value.const_value = ir.ExternalTensor(
                extra_name, offset, len(raw), tensor.dtype, shape=tensor.shape, name=tensor.name,
                doc_string=tensor.doc_string, metadata_props=tensor.metadata_props, base_dir=target.parent)
            offset += len(raw)
    if offset == 0:
        (target.parent / extra_name).unlink()
    ir.save(model, target)
    return True


def copy_vouched(source: Path, target: Path, stop: threading.Event | None = None) -> bool:
    """Copy ``source`` to ``target`` in the kernel and vouch for the copy's digest (see
    :mod:`edgebuild.store.hashstate`): the source's, hashed meanwhile on another core when not known
    yet. Nothing is vouched if the source changed while it was copied. ``stop``: as for
    ``clone_or_copy``; returns whether the copy is complete."""
    before = hashstate.stamp_of(os.stat(source))
    found: list[tuple[str, tuple]] = []
    def digest() -> None:
        try:
            found.append(hashstate.hashed_once(source))
        except OSError:
            pass  # then the store's scan hashes the copy

    hasher = threading.Thread(target=digest, daemon=True)
    hasher.start()
    try:
        complete = clone_or_copy(source, target, stop)  # a reflink where the file system shares extents
    finally:
        hasher.join()
    if complete and found and found[0][1] == before == hashstate.stamp_of(os.stat(source)):
        hashstate.vouch(target, found[0][0])
    return complete


@contextlib.contextmanager
def copying(source: Path, target: Path) -> Iterator[Callable[[], None]]:
    """``copy_vouched(source, target)`` on another thread while inside, for a caller with other work
    meanwhile (an exporter: the copy is disk time, the export CPU time). Yields ``wait()``, which
    returns once the copy is complete (raising what the copy raised). Leaving without having waited
    (an error, Ctrl-C) stops the copy at its next chunk and removes ``target``."""
    stop, failure = threading.Event(), []

    def run() -> None:
        try:
            copy_vouched(source, target, stop)
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="edgebuild-copy", daemon=True)
    thread.start()
    waited = False

    def wait() -> None:
        nonlocal waited
        thread.join()
        waited = True
        if failure:
            raise failure[0]

    try:
        yield wait
    finally:
        if not waited:
            stop.set()
            thread.join()
            Path(target).unlink(missing_ok=True)


def link_sealed(source: Path, target: Path) -> bool:
    """Hard-link ``target`` to the store file ``source``, sealed read-only first, keeping its
    remembered digest for both names; False if it cannot be (another file system, no links)."""
    known = hashstate.known_sha256(source)
    if not seal(source):
        return False
    if known is not None:  # sealing moves the inode's ctime, not its bytes
        hashstate.vouch(source, known)
    try:
        hashstate.link_vouched(source, target)
    except OSError:
        return False
    return True


def load_stage_model(path: Path) -> ir.Model:
    """An ONNX model a stage wrote (its weights stay mapped, not read). Its data file may be a hard
    link to an earlier stage's, or a reference to the source's (see the module docstring): every
    external tensor is checked to lie inside the model's directory (a reference: its link) and
    within its file, then mapped by absolute path."""
    path = Path(path)
    model = ir.load(path)
    check_external_data(model, path.parent, references=True)
    for value, tensor in _initializer_tensors(model):
        if isinstance(tensor, ir.ExternalTensor) and (os.path.islink(tensor.path) or os.stat(tensor.path).st_nlink > 1):
            value.const_value = ir.ExternalTensor(
                os.path.realpath(tensor.path), tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
                name=tensor.name, doc_string=tensor.doc_string, metadata_props=tensor.metadata_props)
    return model
