"""What an artifact is validated against: the reference that evaluates the source model.

In order of preference: the source format's frontend's own evaluation (PyTorch: the eager
module); onnxruntime on the ONNX source; and, for a source with ops onnxruntime does not
register (a plugin's ``mydomain::Swish2``), onnx's ``ReferenceEvaluator`` over the whole graph
with every registered custom op's reference (``edgebuild_register_custom_ops``) and the
references of edgebuild's own fused ops. ``validate.reference: none`` asks for none at all: the
variant is built, not validated, with a warning in its report.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from edgebuild.custom_ops import formal_names
from edgebuild.errors import BuildError
from edgebuild.registration import standard_domain
from edgebuild.threads import cpu_threads
from edgebuild.verify.specs import onnx_input_specs

Runner = Callable[[Mapping[str, Any]], dict]

NONE_WARNING = ("validate.reference: none: the artifact was not compared with its source model, so "
                "nothing checks its outputs")

ONNX_FORMAT = "onnx"  # the core's frontend's format: its source is what onnxruntime runs

# Where onnxruntime's own registry cannot be read: the domains its CPU build implements.
ONNXRUNTIME_DOMAINS = frozenset({"", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc"})


@dataclass(frozen=True)
class Reference:
    """``runner(inputs) -> outputs`` evaluating the source (None: ``validate.reference: none``), the
    input ``specs`` it takes (``{name: {"shape", "dtype"[, "value"]}}``), which evaluator it is in
    words (the report's ``validation.reference``) and warnings for the report."""

    runner: Optional[Runner]
    specs: dict
    name: str
    warnings: list[str] = field(default_factory=list)


def choose_reference(source_path: Path, registry, *, fmt: str, inputs: dict, options: Any, base_dir: Path,
                     section) -> Reference:
    """The reference for validating a build of the source at ``source_path`` (format ``fmt``).

    ``inputs`` is the recipe's ``source.inputs`` as JSON, ``options`` its typed ``source.options``
    (or None), ``section`` its ``ValidateSection``. Raises ``BuildError`` for a source whose custom
    op has no registered reference, naming the op, the plugin that lowers it and the ways out.
    """
    if section.reference == "none":
        return Reference(None, {}, "none", [NONE_WARNING])
    # the core's ONNX frontend (the one "onnx" can name: a second registrant is refused) evaluates
    # nothing itself, and asking it would import onnx_ir and sympy (a quarter second) for that None
    frontend = registry.get("frontends", fmt) if fmt != ONNX_FORMAT else None
    runner = frontend.reference(source_path, inputs, options, base_dir) if frontend is not None else None
    if runner is not None:
        # a runner that knows its inputs' shapes from the source itself carries them
        specs = getattr(runner, "input_specs", None) or frontend.input_specs(inputs)
        return Reference(runner, specs, f"{fmt} (eager)")
    specs = onnx_input_specs(source_path, inputs)
    foreign = ops_onnxruntime_lacks(source_path)
    if not foreign:
        return Reference(onnxruntime_runner(source_path), specs, "onnxruntime")
    if section.reference == "float64":
        raise BuildError(f"validate.reference: float64 cannot evaluate {source_path.name}: onnxruntime and onnx's "
                         f"float64 evaluation have no {', '.join(_label(op) for op in foreign)}",
                         hint="use validate.reference: float32, which evaluates the op with its plugin's reference")
    ops, provided_by = custom_op_references(registry, foreign)
    return Reference(evaluator_runner(source_path, ops), specs,
                     "onnx reference evaluator + " + ", ".join(f"{_label(op)} ({provided_by[op]})" for op in foreign))


# -- onnxruntime ------------------------------------------------------------------------------

# Ops whose arithmetic onnxruntime's extended optimisations re-round: they fuse Q/DQ pairs and
# integer ops into kernels (QLinearConv, MatMulIntegerToFloat, ...) that requantise differently from
# the graph as written, and a fused and an unfused session of one model can disagree at cosine 0.99.
QUANTISED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
                 "QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                 "QLinearLeakyRelu", "QLinearConcat", "QLinearGlobalAveragePool", "QLinearAveragePool",
                 "QLinearSoftmax", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM"}


def quantises_activations(model_path: Path) -> bool:
    """Whether the graph (re)quantises a runtime tensor: any quantised op but a weight's DequantizeLinear."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    constants = {i.name for i in model.graph.initializer}
    constants.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    for node in model.graph.node:
        if node.op_type in QUANTISED_OPS and not (node.op_type == "DequantizeLinear" and node.input[0] in constants):
            return True
    return False


def onnxruntime_runner(model_path: Path) -> Runner:
    """onnxruntime on the source. A graph that quantises activations runs unoptimised: the
    reference is the arithmetic the graph writes, op by op."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise BuildError("validation needs onnxruntime for the reference: pip install onnxruntime") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if os.environ.get("OMP_NUM_THREADS"):  # a thread budget (a Dask worker's): onnxruntime's pool ignores OpenMP's variable
        options.intra_op_num_threads = cpu_threads()
    if quantises_activations(model_path):
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(inputs):
        feed = {n: inputs[n] for n in names if n in inputs}
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))

    return run


def onnxruntime_domains() -> frozenset[str]:
    """The op domains onnxruntime has kernels for, as its registry says."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        return frozenset(standard_domain(kernel.domain) for kernel in state.get_all_opkernel_def())
    except (ImportError, AttributeError):  # not installed, or a build without the listing
        return ONNXRUNTIME_DOMAINS


def ops_onnxruntime_lacks(model_path: Path) -> list[tuple[str, str]]:
    """``(domain, op_type)`` of every op in the graph (subgraphs and local functions too) whose
    domain onnxruntime registers no kernel for, in the order the graph first uses them."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    local = {(standard_domain(f.domain), f.name) for f in model.functions}
    known = onnxruntime_domains()
    found: dict[tuple[str, str], None] = {}

    def walk(nodes) -> None:
        for node in nodes:
            op = (standard_domain(node.domain), node.op_type)
            if op[0] not in known and op not in local:
                found[op] = None
            for attribute in node.attribute:
                for graph in (*([attribute.g] if attribute.HasField("g") else ()), *attribute.graphs):
                    walk(graph.node)

    walk(model.graph.node)
    for function in model.functions:
        walk(function.node)
    return list(found)


# -- onnx's reference evaluator with the custom ops' references ---------------------------------

def custom_op_references(registry, ops: list[tuple[str, str]]) -> tuple[list[type], dict[tuple[str, str], str]]:
    """The evaluator ops (``OpRun`` classes) for ``ops`` — every registered custom op's and edgebuild's
    fused ops' — and who provides each of ``ops``' references ("edgebuild-swish 0.1.0"). Raises
    ``BuildError`` naming the first op nobody provides a reference for."""
    from edgebuild.graph.fused_reference import REFERENCE_OPS

    built_in = {(standard_domain(op.op_domain), op.__name__) for op in REFERENCE_OPS}
    registered = registry.tables["custom_ops"]
    provided_by = {}
    for op in ops:
        entry = registered.get(op)
        if entry is not None:
            provided_by[op] = _plugin_words(registry, entry.plugin)
        elif op in built_in:
            provided_by[op] = "edgebuild"
        else:
            raise _no_reference(registry, op)
    return [*REFERENCE_OPS, *(evaluator_op(entry.obj) for entry in registered.values())], provided_by


def evaluator_op(spec) -> type:
    """An ``OpRun`` computing a :class:`~edgebuild.protocols.CustomOp`'s reference; the evaluator
    hands it the node's inputs in order and its attributes as keywords."""
    from onnx.reference.op_run import OpRun

    input_names, output_names = formal_names(spec.inputs), formal_names(spec.outputs)

    def _run(self, *inputs, **attrs):
        named = {name: value for name, value in zip(input_names, inputs) if value is not None}
        outputs = spec.run_reference(named, attrs)
        return tuple(outputs[name] for name in output_names)

    # the evaluator matches an op by its class's name and op_domain
    return type(spec.op_type, (OpRun,), {"op_domain": spec.domain, "_run": _run})


def evaluator_runner(model_path: Path, ops: list[type]) -> Runner:
    """``run(inputs) -> outputs`` of the model under onnx's reference evaluator with ``ops``."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(model_path))  # with its external data
    evaluator = ReferenceEvaluator(model, new_ops=ops)
    graph_inputs = [value.name for value in model.graph.input]
    names = [value.name for value in model.graph.output]
    lock = threading.Lock()  # the evaluator keeps per-run state; validation runs samples in threads

    def run(inputs):
        feed = {name: inputs[name] for name in graph_inputs if name in inputs}
        with lock:
            return dict(zip(names, evaluator.run(None, feed)))

    return run


def _no_reference(registry, op: tuple[str, str]) -> BuildError:
    """The error for a source op no reference evaluates, naming the plugin that lowers it."""
    lowered_by = _lowering_owners(registry, op)
    lowering = (f"{' and '.join(lowered_by)} lowers it but registers no reference for it" if lowered_by
                else "no installed plugin lowers it or registers a reference for it")
    return BuildError(
        f"validate: the source model uses {_label(op)}, which onnxruntime cannot run, and {lowering}",
        hint=f"register the op's numpy reference from the plugin's edgebuild_register_custom_ops hook "
             f"(edgebuild.plugin.OpReference('{op[0]}', '{op[1]}', reference=...)), or set validate.reference: "
             f"none to build it unvalidated (the report warns)")


def _lowering_owners(registry, op: tuple[str, str]) -> list[str]:
    """Who registered a lowering of ``op`` for any backend: "plugin 'swish' (edgebuild-swish 0.1.0)"."""
    owners = {}
    for backend, table in registry.tables["lowerings"].items():
        for entry in table.entries():
            if (entry.domain, entry.op_type) != op:
                continue
            # the registry names the owner by plugin; its distribution is the one that registered the label
            plugins = [name for name, info in registry.plugins.items()
                       if f"{backend}:{entry.label}" in info.registered.get("lowerings", ())]
            owners[entry.owner] = (f"{entry.owner} ({_plugin_words(registry, plugins[0])})"
                                   if plugins and registry.plugins[plugins[0]].distribution else entry.owner)
    return sorted(owners.values())


def _plugin_words(registry, plugin: str) -> str:
    """A plugin as its distribution and released version ("edgebuild-swish 0.1.0")."""
    info = registry.plugins.get(plugin)
    if info is None or not info.distribution:
        return plugin
    try:
        version = md.version(info.distribution)
    except md.PackageNotFoundError:  # registered in-process (tests): the registry's own version
        version = info.version
    return f"{info.distribution} {version}".strip()


def _label(op: tuple[str, str]) -> str:
    return f"{op[0]}::{op[1]}" if op[0] else op[1]
