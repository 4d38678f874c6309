"""Write a (compressed) MIL program back to an .mlpackage, once.

coremltools' own compression entry points run the whole default pass pipeline on the
program again and then copy the package they wrote to a temporary place. The program we
write was read from a package that already went through that pipeline and only had const
ops replaced by constexpr ops, so the main pipeline is skipped and the package is built in
place beside the destination, then renamed into it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import coremltools as ct
from coremltools.converters.mil.converter import mil_convert
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline


def save_program(program, like: ct.models.MLModel, dst: Path) -> None:
    """Save ``program`` to ``dst`` atomically, with the description and spec version of ``like``."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        written = staging / dst.name
        program_to_model(program, like, package_dir=written)
        if dst.exists():
            os.replace(dst, staging / "previous")
        os.replace(written, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def program_to_model(program, like: ct.models.MLModel, *, package_dir: Path | None = None):
    """An MLModel (not loaded) of ``program``, in ``package_dir`` or a temporary package."""
    spec = like.get_spec()
    extra = {"package_dir": str(package_dir)} if package_dir is not None else {}
    return mil_convert(
        program,
        convert_to="mlprogram",
        convert_from="milinternal",
        specification_version=spec.specificationVersion,
        compute_units=like.compute_unit,
        model_description=spec.description,
        skip_model_load=True,
        pass_pipeline=PassPipeline.EMPTY,
        **extra,
    )
