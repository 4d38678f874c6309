"""Validation inputs for stage bodies that calibrate on them (compression, the fp16 guard)."""

from edgebuild.recipe.validation import ValidateSection
from edgebuild.verify.files import digest_params
from edgebuild.verify.inputs import generate_inputs, iter_inputs
from edgebuild.verify.metrics import compare
from edgebuild.verify.specs import onnx_input_specs

__all__ = ["ValidateSection", "compare", "digest_params", "generate_inputs", "iter_inputs", "onnx_input_specs"]
