"""Numpy reference kernels every executor shares, so the interpreters agree with the references."""

from edgebuild.reference import activations, attention, normalization, reductions, resampling, special

__all__ = ["activations", "attention", "normalization", "reductions", "resampling", "special"]
