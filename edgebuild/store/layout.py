"""The files a stage kind may produce, as a contract between the one who declares the stage and the
store: a stage declares its layout in ``Stage.extra["layout"]`` (a tuple of path patterns), and
an entry whose files fall outside it is refused — a remote entry is not installed, a local one is
not served (and a stage body that writes outside its own layout fails, naming the file).

Patterns are matched against the entry's relative POSIX paths one folder at a time: ``*`` and
``?`` stay within one name (``fnmatch``), ``**`` stands for any number of folders (none
included). ``model.mlpackage/Data/**`` allows every file below that folder; ``*.json`` only
top-level JSON files.

A stage without a declared layout is not checked: the core's import and optimize stages write an
ONNX model whose external data keep the source model's own file names, so their files are not
known in advance; what a backend's stages deliver into an output directory is.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

# what coremltools writes for a package: the manifest and everything under Data/
MLPACKAGE = ("model.mlpackage/Manifest.json", "model.mlpackage/Data/**")
VALIDATION = ("validation.json",)  # edgebuild.dag.validate.save


def _match(parts: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], pattern[0]) and _match(parts[1:], pattern[1:])


def allows(layout, path: str) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is a file ``layout`` lets its stage produce."""
    parts = path.split("/")
    return all(parts) and ".." not in parts and any(_match(parts, p.split("/")) for p in layout)


def outside(layout, paths) -> list[str]:
    """The paths of ``paths`` that ``layout`` does not allow (none when no layout is declared)."""
    if layout is None:
        return []
    return sorted(path for path in paths if not allows(layout, path))
