"""OptionalHasElement and OptionalGetElement where the optional is known when the model is built.

Core ML has no optional values. An absent input is an empty optional; a tensor input (opset 18
accepts plain tensors) is always present. Optionals made at run time (the Optional op) have no
lowering, so they never reach these.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.registry import lowers


@lowers("OptionalHasElement", since=15)
def optional_has_element(ctx, node):
    return np.array(ctx.has_input(node, 0))


@lowers("OptionalGetElement", since=15)
def optional_get_element(ctx, node):
    if not ctx.has_input(node, 0):
        ctx.fail(node, "the optional is empty, so it has no element to get")
    x = ctx.input(node, 0)
    return x if isinstance(x, np.ndarray) else mb.identity(x=x, name=ctx.name(node))
