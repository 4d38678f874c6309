"""The optimise stage: constant folding and clean-up, then the registered graph passes.

Order matters: passes marked ``before_folding`` (weight dequantisation, the quantised-operator
decompositions) run first because folding would expand int8 weights back to float; a recipe's
``quantization: {activations: float}`` then removes the activations' fake quantisation; then onnxscript's optimizer folds
constants (including ``If`` nodes whose condition a fixed input decided), removes dead
code and infers shapes; then each enabled fusion pass; then shapes are inferred again so
the backend sees typed values everywhere.

``optimize.level`` picks the passes a recipe does not switch (``pass_switches``) and how much of
onnxscript's folding and rewriting runs (:mod:`edgebuild.graph.folding`); O2 is the build of a
recipe that names no level.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from pathlib import Path
from typing import Mapping

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from edgebuild.errors import BuildError
from edgebuild.graph.external_data import iter_graphs
from edgebuild.graph.folding import fold_and_clean
from edgebuild.graph.frontend import DATA_FILE, MODEL_FILE
from edgebuild.graph.loop_carried import forget_varying_carried_dims
from edgebuild.graph.weight_files import load_stage_model, save_reusing_data
from edgebuild.graph.quantized.activations import FloatActivations, count_weight_dequantizers
from edgebuild.recipe.model import Quantization
from edgebuild.recipe.passes import DEFAULT_LEVEL, pass_switches

FOLD_INPUT_LIMIT = 8192  # elements: onnxscript's default input size limit for folding


def forget_last_matches() -> None:
    """Drop the graph onnxscript's default rewrite rules still point at after optimising.

    The rules are module-level objects, and each matcher keeps the last graph it matched (and so
    every weight of it, mapped) until the next model. A backend lowering in the same process
    would carry that model through its own peak. Each match sets these fields afresh.
    """
    from onnxscript import rewriter

    for rule in getattr(rewriter, "_DEFAULT_REWRITE_RULES", ()):
        matcher = getattr(rule, "_matcher", None)
        for field in ("_graph", "_match", "_current_node", "_tracer"):
            if hasattr(matcher, field):
                setattr(matcher, field, None)


def keep_weight_transposes(node: ir.Node) -> bool | None:
    """False for a ``Transpose`` of a weight (an initializer above the folding size limit), else
    None (onnxscript's own rules). onnxscript always folds a Transpose that is its input's only
    reader: for ``x @ W.T`` that stores a transposed second copy of every weight, which backends
    reading ``W`` through the Transpose (Core ML's ``linear`` wants [out, in]) never need."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    source = node.inputs[0]
    tensor = source.const_value if source is not None and source.is_initializer() else None
    return False if tensor is not None and tensor.size > FOLD_INPUT_LIMIT else None


def op_counts(model: ir.Model) -> dict[str, int]:
    """Ops by ``domain::type`` (plain type for ai.onnx), subgraphs included."""
    counts: Counter[str] = Counter()
    for graph in iter_graphs(model.graph):
        for node in graph:
            counts[f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type] += 1
    return dict(sorted(counts.items()))


def enabled_passes(passes: Mapping[str, bool] | None, registry=None,
                   level: str = DEFAULT_LEVEL) -> list[tuple[str, object]]:
    """The registry's passes switched on, in registration order.

    ``passes`` are the switches the optimize stage's parameters carry (``pass_switches`` of the
    recipe, its names checked at load); a pass they leave out takes its level's default at
    ``level``, for callers outside a build. A name no plugin registered matches no pass: refusing
    it is the recipe's job.
    """
    if registry is None:
        from edgebuild.registry import get_registry

        registry = get_registry()
    switches = pass_switches(passes or {}, registry, level)
    table = registry.tables["passes"]
    return [(name, table[name].obj) for name, on in switches.items() if on]


def run_pass(name: str, graph_pass, model: ir.Model) -> int:
    try:
        return int(graph_pass.apply(model))
    except Exception as exc:  # a plugin's pass failing must say which pass it was
        raise BuildError(
            f"graph pass {name!r} failed: {type(exc).__name__}: {exc}",
            hint=f"disable it with optimize.passes: {{{name}: false}} and report the model",
        ) from exc


def drop_unreferenced_initializers(model: ir.Model) -> int:
    """Remove initializers no live node reads, e.g. the weights of an ``If`` branch folded away.

    Nodes of a dropped subgraph still count as users in the IR's use lists, so liveness is
    recomputed from the nodes actually reachable from the main graph.
    """
    live: set[int] = set()
    for graph in iter_graphs(model.graph):
        for node in graph:
            live.update(id(v) for v in node.inputs if v is not None)
        live.update(id(v) for v in graph.outputs)
    removed = 0
    for graph in iter_graphs(model.graph):
        for name, value in list(graph.initializers.items()):
            if id(value) not in live and not value.is_graph_input():
                del graph.initializers[name]
                removed += 1
    return removed


def adopt_orphan_constants(model: ir.Model) -> int:
    """Register as initializers the constants a node reads that no graph holds.

    onnxscript's rewriter adds a rule's new initializer under a name it derives from the matched
    output (``<output>/shape``); when a second rewrite derives the same name, the graph's
    initializer table replaces the first value, whose reader keeps it: a constant no graph owns,
    saved as an input nothing produces. Each such value takes a free name in the graph of its reader.
    """
    graphs = list(iter_graphs(model.graph))
    taken = {v.name for g in graphs for v in (*g.inputs, *g.initializers.values(), *(o for n in g for o in n.outputs))}
    adopted = 0
    for graph in graphs:
        for node in graph:
            for value in node.inputs:
                if value is None or value.const_value is None or value.producer() is not None \
                        or value.is_initializer() or value.is_graph_input():
                    continue
                base, suffix = value.name or "constant", 1
                while not value.name or value.name in taken:
                    value.name = f"{base}_{suffix}"
                    suffix += 1
                taken.add(value.name)
                graph.register_initializer(value)
                adopted += 1
    return adopted


def keep_input_names(graph: ir.Graph, names: list[str]) -> None:
    """Undo onnxscript's renaming of a graph input that is also a graph output.

    Its optimizer gives such an input a new name (``x`` -> ``x_orig``) and the output an Identity
    named ``x``; but input names are the model's public names (recipes, validation inputs and
    callers feed them), so the input takes its name back and is the output again.
    """
    for value, name in zip(graph.inputs, names):
        if value.name == name:
            continue
        for index, output in enumerate(graph.outputs):
            producer = output.producer()
            if output.name == name and producer is not None and producer.op_type == "Identity" \
                    and producer.inputs[0] is value and len(output.uses()) == 0:
                graph.outputs[index] = value
                graph.remove(producer, safe=True)
        if all(other.name != name for node in graph for other in node.outputs):
            value.name = name


def _activations(quantization: Quantization | Mapping | None) -> str:
    """quantization.activations as validated at load; its default is the recipe model's."""
    if quantization is None:
        quantization = Quantization()
    return quantization["activations"] if isinstance(quantization, Mapping) else quantization.activations


def infer_shapes(model: ir.Model) -> None:
    # Not strict: edgebuild:: ops have no onnx schema; inference flows around them.
    common_passes.ShapeInferencePass(strict_mode=False)(model)


def optimize(model_path: Path, out_dir: Path, passes: Mapping[str, bool] | None = None, registry=None,
             quantization: Quantization | Mapping | None = None, level: str = DEFAULT_LEVEL) -> dict:
    """Optimise ``model_path`` into ``out_dir/model.onnx`` (+ ``model.onnx.data``); returns a report.

    ``quantization`` is the recipe's section (typed, or its JSON dump; None: the recipe's
    default): with ``activations: float`` the activations' fake-quant pairs are removed once
    every quantised form has been decomposed into them. ``level`` is ``optimize.level``.
    """
    start = time.perf_counter()
    model_path, out_dir = Path(model_path), Path(out_dir)
    model = load_stage_model(model_path)
    selected = enabled_passes(passes, registry, level)
    before = op_counts(model)
    rules: dict[str, int] = {}
    activations = _activations(quantization)
    forget_varying_carried_dims(model)  # before folding, which trusts declared shapes

    for name, graph_pass in selected:
        if graph_pass.before_folding:
            rules[name] = run_pass(name, graph_pass, model)
    input_names = [value.name for value in model.graph.inputs]
    removed = FloatActivations().apply(model) if activations == "float" else 0
    fold_and_clean(model, level, should_fold=keep_weight_transposes)
    adopt_orphan_constants(model)
    keep_input_names(model.graph, input_names)
    forget_last_matches()
    for name, graph_pass in selected:
        if not graph_pass.before_folding:
            rules[name] = run_pass(name, graph_pass, model)
    if activations == "float":  # decompositions that need folded shapes (an unrolled LSTM) run late
        removed += FloatActivations().apply(model)
    common_passes.RemoveUnusedNodesPass()(model)
    drop_unreferenced_initializers(model)
    try:
        infer_shapes(model)
    except Exception:  # custom-domain ops are opaque to onnx's inference; keep what we have
        pass

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / MODEL_FILE
    if target.resolve() == model_path.resolve():
        # Saving over the data file the model is mapped from would corrupt it: read it first.
        ir.external_data.load_to_model(model)
        ir.save(model, target, external_data=DATA_FILE)
    elif not save_reusing_data(model, target, DATA_FILE, model_path.parent / DATA_FILE, link=True):
        ir.save(model, target, external_data=DATA_FILE)
    after = op_counts(model)
    weights_quantized = count_weight_dequantizers(model)
    del model  # onnx_ir graphs are cyclic: collect the weights before the next stage starts
    gc.collect()
    return {
        "level": level,
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "op_counts_before": before,
        "op_counts_after": after,
        "rules": rules,
        "quantization": {"activations": activations, "activation_pairs_removed": removed,
                         "weights_quantized": weights_quantized},
        "seconds": round(time.perf_counter() - start, 3),
    }
