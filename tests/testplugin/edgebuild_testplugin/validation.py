"""The test backend's validation candidate, for recipes that ask for it (``validate: {runtimes: [testcopy]}``):
the copied model run by onnxruntime, compared with the source by the core's validate stage.

A copy matches its source exactly, so to give the suite a variant that misses a limit the way a
lossy compression does, the candidate's outputs are scaled by ``1 + (level - 1) / 10``
(``testcopy:compression.level``; level 1, the default, leaves them as they are).
"""

from __future__ import annotations

import json
from pathlib import Path


def candidate(model: Path):
    import onnxruntime

    settings = model / "compression.json"
    level = json.loads(settings.read_text()).get("level", 1) if settings.exists() else 1
    session = onnxruntime.InferenceSession(str(model / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(inputs):
        feed = {i.name: inputs[i.name] for i in session.get_inputs()}
        return {n: v * (1 + (level - 1) / 10) for n, v in zip(names, session.run(None, feed))}

    return run
