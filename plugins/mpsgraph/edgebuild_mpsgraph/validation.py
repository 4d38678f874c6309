"""Validation of a bundle against its source model.

onnxruntime cannot run a custom op (``com.example::RMSNorm``), so a source with custom-domain
ops is evaluated by onnx's reference evaluator, with each custom op's numpy reference from its
plugin and edgebuild's fused-op references. Otherwise the core's onnxruntime path is used.
"""

from __future__ import annotations

from pathlib import Path

KNOWN_TO_ONNXRUNTIME = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def custom_domains(model_path: Path) -> set[str]:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return {n.domain for n in model.graph.node if n.domain not in KNOWN_TO_ONNXRUNTIME}


def reference_runner(model_path: Path, registry):
    """``run(inputs) -> outputs`` of the source under onnx's reference evaluator plus plugin ops."""
    import onnx
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    from edgebuild.graph.fused_reference import REFERENCE_OPS

    def op_class(spec):
        """An OpRun computing ``spec``'s numpy reference; the node's attributes arrive as keywords."""

        def _run(self, *inputs, **attrs):
            named = {d.name: x for d, x in zip(spec.inputs, inputs)}
            return tuple(spec.run_reference(named, attrs).values())

        return type(spec.op_type, (OpRun,), {"op_domain": spec.domain, "_run": _run})

    model = onnx.load(str(model_path))
    ops = list(REFERENCE_OPS) + [op_class(e.obj) for e in registry.tables["custom_ops"].values()]
    evaluator = ReferenceEvaluator(model, new_ops=ops)
    names = [o.name for o in model.graph.output]

    def run(inputs):
        feed = {i.name: inputs[i.name] for i in model.graph.input if i.name in inputs}
        return dict(zip(names, evaluator.run(None, feed)))

    return run


def validate_bundle(section, source_path: Path, recipe_inputs: dict, candidate, base_dir: Path, registry) -> dict:
    from edgebuild.dag.validate import validate

    if not custom_domains(source_path):
        return validate(section, source_path, recipe_inputs, candidate, base_dir, candidate_name="bundle")
    return validate(section, source_path, recipe_inputs, candidate, base_dir, candidate_name="bundle",
                    reference=reference_runner(source_path, registry), reference_name="onnx-reference-evaluator")
