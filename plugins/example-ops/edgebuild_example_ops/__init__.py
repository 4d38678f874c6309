"""edgebuild-example-ops: a template op plugin adding ``com.example::RMSNorm``.

Copy this package to start your own: the schema (``schema.py``), the numpy reference
(``reference.py``), the Metal kernel (``rms_norm.metal`` + ``kernel.py``), the Core ML
lowering (``coreml.py``) and the hooks that register them (``plugin.py``).
"""

__version__ = "0.1.0"

DOMAIN = "com.example"
OP_TYPE = "RMSNorm"
