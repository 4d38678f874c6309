"""Running one case in this process: the backend's case runner, its warm-up, and a judged record."""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from edgebuild.conformance.cases import Case
from edgebuild.conformance.compare import compare
from edgebuild.errors import EdgebuildError, NotRepresentable, UsageError
from edgebuild.protocols import ConformanceRunner

STATUSES = ("pass", "fail", "error", "unsupported")


@dataclass(frozen=True)
class FunctionRunner:
    """A ``module:function`` given with ``--runner`` (tests), run as a backend's runner is; it has no notes."""

    run: Callable
    notes: str = ""


def resolve_runner(backend: str, runner: str | None = None) -> ConformanceRunner:
    """What runs one case: the function ``runner`` ("module:function") names if given, else the
    registered backend's :meth:`~edgebuild.protocols.Backend.conformance_runner`."""
    if runner:
        module, _, name = runner.partition(":")
        return FunctionRunner(getattr(importlib.import_module(module), name))
    from edgebuild.registry import get_registry

    registered = get_registry().get("backends", backend)
    if registered is None:
        raise UsageError(f"no backend {backend!r} is installed", hint="see `edgebuild plugins` for what is")
    found = registered.conformance_runner()
    if found is None:
        raise UsageError(
            f"backend {backend!r} does not run ONNX conformance cases",
            hint="its backend object's conformance_runner() returns None",
        )
    return found


def run_case(run: Callable, case: Case) -> dict:
    """Run one case with ``run`` and judge it: the case's record without name and op."""
    import onnx

    model = onnx.load_from_string(case.model)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            actual = run(model, list(case.inputs))
    except NotRepresentable as exc:  # a semantic the format lacks, like a type it lacks
        return {"status": "unsupported", "reason": one_line(exc.message)}
    except EdgebuildError as exc:
        return {"status": "error", "reason": one_line(exc.message)}
    except Exception as exc:  # noqa: BLE001 - a backend bug is a result to report, not a crash
        return {"status": "error", "reason": one_line(f"{type(exc).__name__}: {exc}")}
    return compare(actual, case.outputs, case.rtol, case.atol)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters: a reason in a table cell."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def warm_up(run: Callable) -> None:
    """Run a one-node model once, so the backend's imports (seconds on a busy
    machine) are not charged to the first real case's timeout."""
    import onnx.helper as oh

    value = oh.make_tensor_value_info
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "warm_up",
                          [value("x", 1, [1])], [value("y", 1, [1])])
    try:
        run(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 14)]), [np.zeros(1, np.float32)])
    except Exception:  # noqa: BLE001 - a real case will report the problem
        pass
