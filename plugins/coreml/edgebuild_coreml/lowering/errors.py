"""Errors raised while lowering one node; the converter collects them per node."""

from __future__ import annotations

from typing import Callable

from edgebuild.plugin import BuildError


class LoweringError(BuildError):
    """A node the lowering cannot express in MIL (names the node and says why)."""


class TargetTooOld(LoweringError):
    """The node needs a newer deployment target than the recipe's."""


class DeclinedForm(LoweringError):
    """A lowering exists for the op but declines this node's form: an attribute value, a rank or dtype,
    an operand not known at build time. ``reason`` says which (without the node), ``node`` names it."""

    def __init__(self, message: str, *, hint: str | None = None, node: str | None = None,
                 op_type: str | None = None, reason: str | None = None, domain: str = ""):
        super().__init__(message, hint=hint)
        self.node, self.op_type, self.domain, self.reason = node, op_type, domain or "", reason or message


# What a support check returns: None (this form lowers) or the reason it is declined.
SupportCheck = Callable[[object], "str | None"]


def declines(check: SupportCheck):
    """Attach ``check(node) -> reason | None`` to a lowering: the converter runs it on every node of
    the op before lowering anything, so every declined form of a graph is named in one error.

    The check sees only the ONNX node (attributes, static shapes); what needs lowered values (an
    operand known only once MIL folds it) is declined inside the lowering with ``ctx.decline``.
    """

    def attach(fn):
        fn.declined_form = check
        return fn

    return attach


def support_check(fn) -> SupportCheck | None:
    """The check :func:`declines` attached to lowering ``fn``, or None."""
    return getattr(fn, "declined_form", None)
