"""edgebuild-example-ops: a template op plugin adding ``com.example::RMSNorm``.

Copy this package to start your own. Three small examples, each with its test:

- a lowering: ``coreml.py`` decomposes the op into Core ML's MIL ops;
- a fusion pass: ``fusion.py`` rewrites the op written out in ONNX ops into the op;
- a kernel: ``rms_norm.metal`` + ``kernel.py`` declare its Metal kernel (the ``[msl]`` extra).

Around them: the ONNX schema (``schema.py``), the numpy reference every implementation is checked
against (``reference.py``) and the hooks that register it all (``plugin.py``). The plugin imports
only ``edgebuild.plugin`` from edgebuild.
"""

__version__ = "0.1.0"

DOMAIN = "com.example"
OP_TYPE = "RMSNorm"
