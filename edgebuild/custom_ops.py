"""A custom op declared by its reference alone, for plugins that lower an op but ship no kernel.

Register one from ``edgebuild_register_custom_ops`` so validation can evaluate a source model
that uses the op (onnxruntime cannot)::

    from edgebuild.plugin import OpReference, hookimpl

    def swish2(x, *, beta=1.0):
        return x / (1.0 + np.exp(-beta * x))

    @hookimpl
    def edgebuild_register_custom_ops(register):
        register("mydomain", "Swish2", OpReference("mydomain", "Swish2", reference=swish2,
                                                   inputs=("X",), outputs=("Y",), attributes={"beta": 1.0}))

A plugin with a kernel registers its kernel's declaration instead (``edgebuild_msl.KernelSpec``):
both follow :class:`edgebuild.protocols.CustomOp`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


@dataclass(frozen=True)
class OpReference:
    """``domain::op_type`` computed by ``reference(*inputs, **attributes)`` (numpy arrays in, an
    array or a tuple of them out, in ``outputs``' order). ``attributes`` maps each attribute the
    op takes to its default; a node's own values override them."""

    domain: str
    op_type: str
    reference: Callable[..., Any]
    inputs: Sequence[str] = ("X",)
    outputs: Sequence[str] = ("Y",)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def run_reference(self, inputs: Mapping[str, Any], attrs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Output arrays by name for input arrays by name (optional inputs may be left out)."""
        import numpy as np

        unknown = sorted(set(attrs or {}) - set(self.attributes))
        if unknown:
            raise ValueError(f"{self.qualified_name}: unknown attribute(s) {', '.join(unknown)}; "
                             f"it takes {', '.join(self.attributes) or 'none'}")
        result = self.reference(*(inputs[name] for name in self.inputs if name in inputs),
                                **{**self.attributes, **(attrs or {})})
        if not isinstance(result, (tuple, list)):
            result = (result,)
        return {name: np.asarray(value) for name, value in zip(self.outputs, result)}


def formal_names(declared: Sequence) -> list[str]:
    """The names of a custom op's declared inputs or outputs: each is a name or a declaration with
    a ``name`` (``edgebuild_msl.TensorDecl``)."""
    return [item if isinstance(item, str) else item.name for item in declared]
