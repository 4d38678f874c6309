"""Helpers for MIL interpreter tests: input specs, and saving a Builder program as an
.mlpackage so it is read back the way a built artifact would be."""

from __future__ import annotations

import coremltools as ct
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild_coreml.interpreter import run_mlpackage

FP32 = ct.precision.FLOAT32
FP16 = ct.precision.FLOAT16


def saved(prog, path, *, precision=FP32, target=ct.target.iOS17):
    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=target,
        compute_precision=precision,
        skip_model_load=True,
    )
    model.save(str(path))
    return path


def roundtrip(prog, tmp_path, inputs, **kwargs):
    fp16 = kwargs.pop("fp16", False)
    return run_mlpackage(saved(prog, tmp_path / "m.mlpackage", **kwargs), inputs, fp16=fp16)


def spec(shape, dtype=types.fp32):
    return mb.TensorSpec(shape=shape, dtype=dtype)
