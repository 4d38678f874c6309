"""Collecting the ONNX backend node test cases from the installed ``onnx`` wheel."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from edgebuild.errors import UsageError

if TYPE_CHECKING:  # numpy loads with the suite, not with edgebuild.plugin, which re-exports Case
    import numpy as np

SUITES = ("onnx-node",)


@dataclass
class Case:
    """One ONNX node test case, in a form that pickles cheaply to a worker."""

    name: str
    op: str  # the op under test ("domain::Op" outside the default domain)
    model: bytes  # serialized ModelProto
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    rtol: float
    atol: float
    reason: str | None = None  # set when classified unsupported without running
    record: dict = field(default_factory=dict)


def qualified_op(domain: str, op_type: str) -> str:
    """How a case names its op: ``Relu``, or ``domain::Op`` outside the default domain."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def _base_name(name: str) -> str:
    """``test_x_expanded_ver18`` -> ``test_x``: function-expanded cases test the same op."""
    return re.sub(r"_expanded(_ver\d+)?$", "", name)


def _array(value) -> np.ndarray:
    import onnx

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    import numpy as np

    return value if isinstance(value, (list, dict)) else np.asarray(value)


def collect_cases(suite: str = "onnx-node", ops: Sequence[str] | None = None, registry=None) -> list[Case]:
    """Every case of ``suite`` (optionally only the cases of ``ops``), sorted by name: the ONNX
    node tests, or a suite a plugin registered (``edgebuild_register_conformance_suites``)."""
    if suite not in SUITES:
        plugin_suites = registry.names("conformance_suites") if registry is not None else []
        if suite not in plugin_suites:
            raise UsageError(f"unknown conformance suite {suite!r}",
                             hint=f"choose one of: {', '.join([*SUITES, *plugin_suites])}")
        return sorted(registry.get("conformance_suites", suite)(list(ops) if ops else None), key=lambda c: c.name)
    from onnx.backend.test.case.node import collect_testcases

    import numpy as np

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the generators' own overflow/divide warnings
        testcases = list(collect_testcases())
    op_of = {
        t.name: qualified_op(t.model.graph.node[0].domain, t.model.graph.node[0].op_type)
        for t in testcases
        if len(t.model.graph.node) == 1
    }
    wanted = _op_filter(ops, set(op_of.values()))
    cases = []
    for t in testcases:
        op = op_of.get(t.name) or op_of.get(_base_name(t.name)) or "?"
        if wanted is not None and op not in wanted:
            continue
        inputs, outputs = t.data_sets[0]
        cases.append(Case(t.name, op, t.model.SerializeToString(), [_array(a) for a in inputs],
                          [_array(a) for a in outputs], t.rtol, t.atol))
    return sorted(cases, key=lambda c: c.name)


def _op_filter(ops: Sequence[str] | None, known: set[str]) -> set[str] | None:
    if not ops:
        return None
    by_lower = {op.lower(): op for op in known}
    unknown = [op for op in ops if op.lower() not in by_lower]
    if unknown:
        raise UsageError(
            f"no ONNX node test cases for op(s): {', '.join(unknown)}",
            hint="op names are ONNX op types as spelled in the spec, e.g. Add,Conv,ReduceMean",
        )
    return {by_lower[op.lower()] for op in ops}
