"""Checks on a model's external data before any of it is read.

An ONNX file names its weight files by relative path. A model downloaded from the internet
must not be able to make the build read ``../../etc/passwd`` or run past the end of a
truncated download, so every external tensor is checked up front and the build stops with
a message naming the tensor and the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx_ir as ir

from edgebuild.errors import BuildError


def iter_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and every subgraph nested in its nodes' attributes (If/Loop/Scan bodies)."""
    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                yield from iter_graphs(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    yield from iter_graphs(sub)


def iter_tensors(model: ir.Model) -> Iterator[ir.TensorProtocol]:
    """Every tensor the model holds: initializers and tensor attributes, subgraphs included."""
    for graph in iter_graphs(model.graph):
        for value in graph.initializers.values():
            if value.const_value is not None:
                yield value.const_value
        for node in graph:
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.TENSOR and attr.value is not None:
                    yield attr.value
                elif attr.type == ir.AttributeType.TENSORS and attr.value is not None:
                    yield from attr.value


def check_external_data(model: ir.Model, model_dir: Path, *, references: bool = False) -> int:
    """Raise BuildError unless every external tensor lies inside ``model_dir`` and in bounds.

    ``references``: ``model_dir`` is a store entry, whose data file may be a symbolic link to the
    source's (``edgebuild.store.links.refer``): the link itself must lie inside, its target may
    not. Returns the number of external tensors checked.
    """
    root = Path(os.path.realpath(model_dir))
    sizes: dict[Path, int] = {}
    places: dict[str, Path | None] = {}  # location -> the file it resolves to, None when outside
    checked = 0
    for tensor in iter_tensors(model):
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        checked += 1
        location = str(tensor.location)
        name = tensor.name or "<unnamed>"
        if os.path.isabs(location):
            raise BuildError(
                f"tensor {name!r} stores its data at the absolute path {location!r}",
                hint="external data must be a relative path inside the model's directory",
            )
        if location not in places:  # every tensor of a model names the same file or few
            places[location] = _resolved_inside(root, location, references)
        resolved = places[location]
        if resolved is None:
            raise BuildError(
                f"tensor {name!r} points at external data file {location!r}, "
                f"which lies outside the model's directory",
                hint="the model file is malformed or hostile; re-export it with its data beside it",
            )
        if resolved not in sizes:
            if not resolved.is_file():
                raise BuildError(
                    f"tensor {name!r} needs external data file {location!r}, which does not exist",
                    hint="copy the weights file next to the model file",
                )
            sizes[resolved] = resolved.stat().st_size
        offset = tensor.offset or 0
        length = tensor.length if tensor.length is not None else tensor.nbytes
        if offset + length > sizes[resolved]:
            raise BuildError(
                f"tensor {name!r} reads bytes {offset}..{offset + length} of external data file "
                f"{location!r}, which holds only {sizes[resolved]} bytes",
                hint="the weights file is truncated; download it again",
            )
    return checked


def _resolved_inside(root: Path, location: str, references: bool) -> Path | None:
    """The file ``location`` names below ``root``, None when it lies outside."""
    # realpath also resolves symlinks, so a link pointing outside is caught too.
    resolved = Path(os.path.realpath(root / location))
    if references:  # only the file's own name may be a link (a reference), no folder above it
        named = Path(os.path.realpath((root / location).parent)) / Path(location).name
        inside = named.parent == root or root in named.parent.parents
        if not named.is_symlink():
            inside = inside and (resolved == root or root in resolved.parents)
    else:
        inside = resolved == root or root in resolved.parents
    return resolved if inside else None
