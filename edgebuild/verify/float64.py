"""The source model evaluated in float64: the exact answer validation can measure both sides against.

onnxruntime's fp32 result is itself rounded. Where an output is small and comes out of long sums
or cancellation (LayerNorm outputs, box offsets, LSTM state, a detector's near-zero probability
map), two correct fp32 evaluations differ by more than a tight limit, and cosine against that
reference says more about the reference than about the conversion. ``to_float64`` rewrites the
graph to compute in double wherever the source computes in float; ``float64_runner`` runs it with
onnxruntime where it has double kernels for every op, else with onnx's reference evaluator.
"""

from __future__ import annotations

import re
import threading
from typing import Callable, Mapping

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]

# Op inputs / outputs the ONNX spec does not allow to be double: quantisation math (which keeps
# computing in float, as the source graph does) and resize scales. Float inputs there are cast
# back down, float outputs up.
FLOAT_ONLY_OPS = {
    ("", "DequantizeLinear"): {"inputs": (1,), "outputs": (0,)},
    ("", "QuantizeLinear"): {"inputs": (0, 1), "outputs": ()},
    ("", "DynamicQuantizeLinear"): {"inputs": (0,), "outputs": (1,)},
    ("", "Resize"): {"inputs": (2,), "outputs": ()},
    ("", "Upsample"): {"inputs": (1,), "outputs": ()},
}
# Ops that name their output type in a ``dtype`` attribute.
DTYPE_ATTRIBUTE_OPS = {"EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"}
# Ops that accumulate in a type of their own choosing (``stash_type``, float by default).
STASH_TYPE_OPS = {"LayerNormalization"}


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` that computes in float64 wherever the source computes in float32.

    Weights, Constant tensors, declared value types and Casts to float become double;
    LayerNormalization accumulates in double; ops that only take float (quantisation) stay float
    behind casts. Integer and float16 parts of the graph are left as they are.
    """
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    float_names = _float_value_names(model)
    _convert_graph(converted.graph, float_names)
    return converted


def _float_value_names(model: onnx.ModelProto) -> set[str]:
    """Names of every float32 value of the source (graph, subgraphs), from shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is best effort: declared types still help
        inferred = model
    names: set[str] = set()

    def collect(graph: onnx.GraphProto) -> None:
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.tensor_type.elem_type == TensorProto.FLOAT:
                names.add(value.name)
        names.update(i.name for i in graph.initializer if i.data_type == TensorProto.FLOAT)
        for node in graph.node:
            for sub in _subgraphs(node):
                collect(sub)

    collect(inferred.graph)
    return names


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs = []
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            graphs.append(attribute.g)
        graphs.extend(attribute.graphs)
    return graphs


def _double_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)


def _convert_graph(graph: onnx.GraphProto, float_names: set[str]) -> None:
    for value in [*graph.input, *graph.output, *graph.value_info]:
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type == TensorProto.FLOAT:
            tensor_type.elem_type = TensorProto.DOUBLE
    for initializer in graph.initializer:
        if initializer.data_type == TensorProto.FLOAT:
            initializer.CopyFrom(_double_tensor(initializer))

    nodes = []
    for node in graph.node:
        _convert_attributes(node, float_names)
        for sub in _subgraphs(node):
            _convert_graph(sub, float_names)
        nodes.extend(_keep_float(node, float_names))
    del graph.node[:]
    graph.node.extend(nodes)


def _convert_attributes(node: onnx.NodeProto, float_names: set[str]) -> None:
    for attribute in node.attribute:
        if attribute.type == AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT:
            attribute.t.CopyFrom(_double_tensor(attribute.t))
        elif attribute.type == AttributeProto.TENSORS:
            for tensor in attribute.tensors:
                if tensor.data_type == TensorProto.FLOAT:
                    tensor.CopyFrom(_double_tensor(tensor))
    if node.op_type == "Constant":
        _constant_as_double_tensor(node)
    if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1))))  # float 0
    type_attribute = "to" if node.op_type == "Cast" else "dtype" if node.op_type in DTYPE_ATTRIBUTE_OPS else None
    for attribute in node.attribute:
        if attribute.name == type_attribute and attribute.i == TensorProto.FLOAT:
            attribute.i = TensorProto.DOUBLE
    if node.op_type in STASH_TYPE_OPS and node.input and node.input[0] in float_names:
        kept = [a for a in node.attribute if a.name != "stash_type"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("stash_type", TensorProto.DOUBLE)])


def _constant_as_double_tensor(node: onnx.NodeProto) -> None:
    """``value_float(s)`` always make float32: restate them as a double ``value`` tensor."""
    for attribute in list(node.attribute):
        if attribute.name in ("value_float", "value_floats"):
            data = attribute.f if attribute.name == "value_float" else list(attribute.floats)
            array = np.asarray(data, dtype=np.float32).astype(np.float64)  # the float32 value, exactly
            node.attribute.remove(attribute)
            node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(array)))


def _keep_float(node: onnx.NodeProto, float_names: set[str]) -> list[onnx.NodeProto]:
    """``node`` itself, wrapped in casts if it is one of the float-only ops."""
    rule = FLOAT_ONLY_OPS.get((node.domain, node.op_type))
    if rule is None:
        return [node]
    before, after = [], []
    for index in rule["inputs"]:
        name = node.input[index] if index < len(node.input) else ""
        if name in float_names:
            cast = f"{name}__as_float32_for_{node.name or node.op_type}_{index}"
            before.append(helper.make_node("Cast", [name], [cast], to=TensorProto.FLOAT))
            node.input[index] = cast
    for index in rule["outputs"]:
        name = node.output[index] if index < len(node.output) else ""
        if name in float_names:
            node.output[index] = f"{name}__float32"
            after.append(helper.make_node("Cast", [node.output[index]], [name], to=TensorProto.DOUBLE))
    return [*before, node, *after]


def float64_runner(model64: onnx.ModelProto) -> tuple[Runner, str]:
    """Run the float64 graph: onnxruntime if it has double kernels for all of it, else the
    ONNX reference evaluator. Returns the runner and which evaluator it is."""
    names = [value.name for value in model64.graph.output]
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 4
        # op by op, as written: no fusions into kernels that may accumulate differently
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model64.SerializeToString(), options, providers=["CPUExecutionProvider"])
        inputs = [i.name for i in session.get_inputs()]

        def run_ort(feed):
            return dict(zip(names, session.run(names, {n: feed[n] for n in inputs if n in feed})))

        return run_ort, "onnxruntime"
    except Exception as error:  # typically NOT_IMPLEMENTED: no double kernel for some op
        missing = re.search(r"implementation for (\w+)\(", str(error))
        why = (f"onnxruntime has no double {missing.group(1)}" if missing
               else f"onnxruntime cannot run it: {str(error).split('] : ')[-1][:100]}")
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model64, new_ops=[*_reference_ops_in_double(), *_quantizers_before_19(model64)])
    graph_inputs = set(evaluator.input_names)
    lock = threading.Lock()  # the evaluator keeps per-run state; validation runs samples in threads

    def run_reference(feed):
        with lock:
            return dict(zip(names, evaluator.run(names, {n: v for n, v in feed.items() if n in graph_inputs})))

    return run_reference, f"onnx reference ({why})"


def _reference_ops_in_double() -> list[type]:
    """Reference-evaluator ops replaced for a faithful double evaluation: Erf evaluates through
    float32; LayerNormalization refuses a stash_type other than float (on double input it
    computes in double, which is what ``to_float64``'s stash_type asks for); BatchNormalization
    picks training mode for inference graphs."""
    from math import erf

    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_erf import Erf
    from onnx.reference.ops.op_layer_normalization import LayerNormalization

    class ErfInInputType(Erf):
        op_domain = ""

        def _run(self, x):
            return (np.vectorize(erf, otypes=[x.dtype])(x),)

    class LayerNormalizationDoubleStash(LayerNormalization):
        op_domain = ""

        def _run(self, X, Scale, B=None, axis=None, epsilon=None, stash_type=None):
            if stash_type == TensorProto.DOUBLE and X.dtype == np.float64:
                stash_type = TensorProto.FLOAT  # the reference implementation's only (input-typed) path
            return super()._run(X, Scale, B, axis=axis, epsilon=epsilon, stash_type=stash_type)

    class BatchNormalizationInference(OpRun):
        """onnx's reference BatchNormalization (opset 9-13) switches to training mode whenever
        the node carries a ``momentum`` attribute, as exported inference graphs often do;
        onnxruntime and the spec go by the outputs: one output is inference."""

        op_domain = ""

        def _run(self, x, scale, bias, mean, var, **attributes):
            if attributes.get("training_mode") or len(self.onnx_node.output) > 1:
                raise NotImplementedError("BatchNormalization in training mode")
            epsilon = attributes.get("epsilon")
            epsilon = 1e-5 if epsilon is None else epsilon
            per_channel = (1, -1) + (1,) * (x.ndim - 2)
            normalised = (x - mean.reshape(per_channel)) / np.sqrt(var.reshape(per_channel) + epsilon)
            return ((normalised * scale.reshape(per_channel) + bias.reshape(per_channel)).astype(x.dtype),)

    # the evaluator matches overrides by class name
    ErfInInputType.__name__ = "Erf"
    LayerNormalizationDoubleStash.__name__ = "LayerNormalization"
    BatchNormalizationInference.__name__ = "BatchNormalization"
    return [ErfInInputType, LayerNormalizationDoubleStash, BatchNormalizationInference]


def _quantizers_before_19(model: onnx.ModelProto) -> list[type]:
    """DequantizeLinear for graphs of opset 10-18, which onnx's reference evaluator no longer
    implements below 19. Its newest kernel computes every earlier form the same way (per-tensor,
    or per-axis from 13; block size and output type default to none), so it stands in for them;
    the evaluator fills an override's attributes from the newest schema."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= 19:
        return []
    from onnx.reference.ops import op_dequantize_linear as kernels

    newest = max((name for name in dir(kernels) if name.startswith("DequantizeLinear_")),
                 key=lambda name: int(name.rsplit("_", 1)[1]))

    class DequantizeLinearBefore19(getattr(kernels, newest)):
        op_domain = ""

    DequantizeLinearBefore19.__name__ = "DequantizeLinear"  # the evaluator matches overrides by class name
    return [DequantizeLinearBefore19]


def as_float64_feed(sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float32 inputs widened (exactly) to float64; integer inputs unchanged."""
    return {n: v.astype(np.float64) if v.dtype == np.float32 else v for n, v in sample.items()}


ONNX_REFERENCES = ("onnxruntime",)  # the validation reference that runs the ONNX source as float64 evaluators can


def float64_truth(source_path, reference_name: str, reference=None) -> tuple[Runner, str]:
    """``float64_reference`` for validation, refused with a clear error where it cannot stand in.
    A frontend's own ``reference`` runner that evaluates in float64 (its ``float64()``) does it instead."""
    from edgebuild.errors import BuildError, EdgebuildError

    own = getattr(reference, "float64", None)
    if own is not None:
        try:
            return own()
        except EdgebuildError:
            raise
        except Exception as exc:  # the frontend's evaluator failing must say so, not crash validation
            raise BuildError(f"validate.reference: float64: {reference_name} cannot evaluate the source in float64 "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                             hint="use validate.reference: float32") from exc
    if reference_name not in ONNX_REFERENCES:
        raise BuildError(f"validate.reference: float64 evaluates an ONNX source, and this recipe's reference "
                         f"is {reference_name}", hint="remove validate.reference, or convert from the ONNX export")
    try:
        return float64_reference(source_path)
    except Exception as exc:  # an op no float64 evaluator has: say so rather than fall back silently
        raise BuildError(f"validate.reference: float64: the source cannot be evaluated in float64 "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                         hint="use validate.reference: float32 (onnxruntime on the source)") from exc


def float64_reference(source_path) -> tuple[Runner, str]:
    """A runner of the ONNX source in float64 that takes the fp32 feeds validation generates (widened
    exactly) and returns float64 outputs, and the name of the evaluator that runs it."""
    run, evaluator = float64_runner(to_float64(onnx.load(str(source_path))))
    return (lambda feed: run(as_float64_feed(feed))), evaluator
