"""ONNX -> MPSGraph program lowering: one small module per op family, registered by op type."""

from edgebuild_mpsgraph.lowering import elementwise, nn, tensor  # noqa: F401  (they register lowerings)
from edgebuild_mpsgraph.lowering.converter import lower_model, supports, unsupported
from edgebuild_mpsgraph.lowering.registry import LOWERINGS

__all__ = ["LOWERINGS", "lower_model", "supports", "unsupported"]
