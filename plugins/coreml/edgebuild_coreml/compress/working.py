"""The model being compressed, as an MLModel, a MIL program, or both, converted only when needed."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import coremltools as ct

from .program import load_program
from .serialize import program_to_model, save_program


class WorkingModel:
    """Passes that rewrite the MIL program in place and coremltools' passes that take an MLModel
    share one of these, so the program is read and written once however the passes alternate."""

    def __init__(self, model: ct.models.MLModel):
        self._model = model
        self._program = None
        self._program_changed = False

    @property
    def program(self):
        if self._program is None:
            self._program = load_program(self._model)
        return self._program

    def program_changed(self) -> None:
        """The program was rewritten in place; the MLModel no longer matches it."""
        self._program_changed = True

    @property
    def model(self) -> ct.models.MLModel:
        if self._program_changed:
            self._model = program_to_model(self._program, like=self._model)
            self._program_changed = False
        return self._model

    @model.setter
    def model(self, model: ct.models.MLModel) -> None:
        self._model, self._program, self._program_changed = model, None, False

    def save(self, dst: Path) -> None:
        if self._program_changed:
            save_program(self._program, self._model, dst)
        else:
            _save_atomically(self._model, dst)


def _save_atomically(model: ct.models.MLModel, dst: Path) -> None:
    """Write next to ``dst`` and rename into place, so readers never see a partial package."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        written = staging / dst.name
        model.save(str(written))
        if dst.exists():
            retired = staging / "previous"
            os.replace(dst, retired)
        os.replace(written, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
