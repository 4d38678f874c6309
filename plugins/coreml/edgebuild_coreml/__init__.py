"""edgebuild-coreml: ONNX to Core ML lowering, compression, a MIL interpreter and ANE rules."""

__version__ = "0.1.0"

import logging as _logging
import os as _os

# coremltools announces at import that Core ML's runtime is missing (always so off macOS)
# and draws a progress bar per pass pipeline; neither helps a build log.
_logging.getLogger("coremltools").setLevel(_logging.ERROR)
_os.environ.setdefault("TQDM_DISABLE", "1")

# coremltools without the torch/sklearn/tensorflow/... frontends when nothing imported torch
# first (edgebuild_coreml/coremltools_import.py says why); nothing is imported here.
from edgebuild_coreml import coremltools_import as _coremltools_import  # noqa: E402

_coremltools_import.install()
