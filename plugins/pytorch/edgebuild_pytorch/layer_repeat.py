"""A deep decoder's ONNX graph from the export of its first two layers.

``torch.export``, its decompositions and the ONNX translation cost time per layer, and a decoder is a
stack of identical layers. So the model is exported with its layer list cut to two; the second
layer's nodes are the unit that repeats. Layer ``k`` is that unit copied, with layer 1's weights,
cache inputs and outputs replaced by layer ``k``'s, its hidden-state input taken from layer ``k-1``.
Values the unit shares with the first layer (rotary tables, the mask, shape arithmetic the optimiser
merged across layers) stay shared, as the whole-model export shares them.

Only stacks whose layers are one class and one kind (``layer_types``) are cut; anything in the
two-layer graph that does not fit this shape makes ``repeat_layers`` return None, and the caller
exports the whole model.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

SCOPES = "pkg.torch.onnx.name_scopes"  # the exporter's module path of each node
UNIT_LAYERS = 2  # layers exported: layer 0 shares, layer 1 is the unit


class NotRepeatable(Exception):
    """The two-layer graph is not a prelude, layer 0, a repeatable layer 1 and a tail."""


def layer_list(model):
    """(dotted path, ModuleList) of the decoder's layers: the ModuleList as long as ``num_hidden_layers``."""
    import torch

    config = model.config.get_text_config(decoder=True)
    count = config.num_hidden_layers
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == count]
    return found[0] if len(found) == 1 else None


def repeatable(model) -> bool:
    """More layers than the unit, all of one class, and one kind of attention."""
    config = model.config.get_text_config(decoder=True)
    found = layer_list(model)
    if found is None or config.num_hidden_layers <= UNIT_LAYERS:
        return False
    layers = found[1]
    if len({type(layer) for layer in layers}) != 1:
        return False
    kinds = getattr(config, "layer_types", None)
    return kinds is None or len(set(kinds)) == 1


@contextlib.contextmanager
def first_layers(model, count: int = UNIT_LAYERS) -> Iterator[None]:
    """``model`` with only its first ``count`` layers (config included) while inside."""
    import torch

    path, layers = layer_list(model)
    owner_path, _, attribute = path.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    configs = {id(c): c for c in (model.config, model.config.get_text_config(decoder=True))}.values()
    saved = [(c, c.num_hidden_layers, getattr(c, "layer_types", None)) for c in configs]
    setattr(owner, attribute, torch.nn.ModuleList(list(layers)[:count]))
    for config, _, kinds in saved:
        config.num_hidden_layers = count
        if kinds is not None:
            config.layer_types = list(kinds)[:count]
    try:
        yield
    finally:
        setattr(owner, attribute, layers)
        for config, layer_count, kinds in saved:
            config.num_hidden_layers = layer_count
            if kinds is not None:
                config.layer_types = kinds


def repeat_layers(graph, parameters: dict, layers: int, layer_path: str) -> bool:
    """Grow ``graph`` (a model's export cut to two layers; ``parameters`` the whole model's, by the
    graph's names, ``layer_path`` the layer list's path) to ``layers`` layers in place; False when
    its shape does not allow it (``graph`` is then to be discarded)."""
    if layers <= UNIT_LAYERS:
        return False
    try:
        plan = _plan(graph, layer_path)
        for k in range(UNIT_LAYERS, layers):
            _add_layer(graph, plan, k, parameters, layer_path)
    except NotRepeatable:
        return False
    _finish(plan)
    return True


def _layer_of(node, layer_path: str) -> int | None:
    scopes = node.metadata_props.get(SCOPES, "")
    match = re.search(re.escape(f"'{layer_path}.") + r"(\d+)'", scopes)
    return int(match.group(1)) if match else None


class _Plan:
    def __init__(self):
        self.unit: list = []  # layer 1's nodes, in graph order
        self.carry_in = None  # layer 0's hidden-state output, layer 1's input
        self.carry_out = None  # layer 1's hidden-state output
        self.tail_first = None  # the first node after layer 1
        self.external: dict = {}  # id(value) -> value used by the unit, made outside it
        self.kind: dict = {}  # id(value) -> "shared" | "carry" | "cache" | "weight" | "constant"
        self.cache_outputs: list = []  # (graph output index, value) of layer 1's present.*
        self.tail_uses: list = []  # (node, input index) reading layer 1's hidden state after the layers
        self.carry_now = None  # the hidden state of the last layer added


def _layers(nodes: list, layer_path: str) -> dict:
    """id(node) -> its layer, or None outside the layers. A node the optimiser made (no module
    path; e.g. slices merged into a Split) belongs to the layer all its users are in."""
    layer = {id(n): _layer_of(n, layer_path) for n in nodes}
    for node in reversed(nodes):
        if SCOPES in node.metadata_props:
            continue
        users = {layer.get(id(user)) for value in node.outputs for user, _ in value.uses()}
        if len(users) == 1:
            layer[id(node)] = users.pop()
    return layer


def _plan(graph, layer_path: str) -> _Plan:
    nodes = list(graph)
    layer = _layers(nodes, layer_path)
    plan = _Plan()
    plan.unit = [n for n in nodes if layer[id(n)] == 1]
    if not plan.unit:
        raise NotRepeatable("no layer-1 nodes")
    # layer 1 must be one contiguous run of nodes, after every layer-0 node
    positions = [i for i, n in enumerate(nodes) if layer[id(n)] == 1]
    if positions != list(range(positions[0], positions[-1] + 1)):
        raise NotRepeatable("layer 1 is not contiguous")
    if any(layer[id(n)] == 0 for n in nodes[positions[-1]:]):
        raise NotRepeatable("layer 0 after layer 1")
    if any(layer[id(n)] not in (None, 0, 1) for n in nodes):
        raise NotRepeatable("more than two layers")
    plan.tail_first = nodes[positions[-1] + 1] if positions[-1] + 1 < len(nodes) else None
    in_unit = {id(n) for n in plan.unit}
    used_by_layer0 = set()
    for n in nodes:
        if layer[id(n)] == 0:
            used_by_layer0.update(id(v) for v in n.inputs if v is not None)
    past1 = {v.name: v for v in graph.inputs if v.name.startswith("past_key_values.1.")}
    initializers = {id(v) for v in graph.initializers.values()}
    carries = []
    for node in plan.unit:
        for value in node.inputs:
            if value is None or id(value) in plan.kind:
                continue
            producer = value.producer()
            if producer is not None and id(producer) in in_unit:
                continue
            plan.external[id(value)] = value
            if value.is_graph_input():
                plan.kind[id(value)] = "cache" if value.name in past1.keys() else "shared"
            elif id(value) in initializers:
                plan.kind[id(value)] = _initializer_kind(value, layer_path, used_by_layer0, in_unit)
            elif id(value) in used_by_layer0:
                plan.kind[id(value)] = "shared"
            elif producer is not None and layer[id(producer)] == 0:
                plan.kind[id(value)] = "carry"
                carries.append(value)
            else:
                raise NotRepeatable(f"{value.name}: made before the layers, used by layer 1 only")
    if len(carries) != 1:
        raise NotRepeatable(f"{len(carries)} hidden-state inputs to layer 1")
    plan.carry_in = carries[0]
    outputs = {id(v): i for i, v in enumerate(graph.outputs)}
    leaving = []
    for node in plan.unit:
        for value in node.outputs:
            users = [u for u, _ in value.uses() if id(u) not in in_unit]
            if id(value) in outputs:
                if users or not value.name.startswith("present.1."):
                    raise NotRepeatable(f"{value.name}: an unexpected output of layer 1")
                plan.cache_outputs.append((outputs[id(value)], value))
            elif users:
                leaving.append(value)
    if len(leaving) != 1 or any(_layer_of(u, layer_path) is not None for u, _ in leaving[0].uses()
                                if id(u) not in in_unit):
        raise NotRepeatable("layer 1 does not hand one hidden state to the tail")
    plan.carry_out = leaving[0]
    plan.tail_uses = [(u, i) for u, i in plan.carry_out.uses() if id(u) not in in_unit]
    return plan


def _initializer_kind(value, layer_path: str, used_by_layer0: set, in_unit: set) -> str:
    if id(value) in used_by_layer0:
        return "shared"
    if _parameter_name(value, layer_path) is not None:
        return "weight"
    if any(id(u) not in in_unit for u, _ in value.uses()):
        return "shared"
    # The optimiser's folds lose the parameter names: a float tensor only layer 1 reads may be
    # one of its weights, folded. Shape arithmetic and scalars are safe to copy per layer.
    if value.dtype is not None and value.dtype.is_floating_point() and value.const_value.size > 1:
        raise NotRepeatable(f"{value.name}: a float tensor of layer 1 that is not a parameter")
    return "constant"


def _parameter_name(value, layer_path: str) -> str | None:
    """The layer-1 parameter ``value`` holds (itself, or transposed when written), else None."""
    name = value.meta.get("source_weight", value.name)
    return name if name.startswith(f"{layer_path}.1.") else None


def _add_layer(graph, plan: _Plan, k: int, parameters: dict, layer_path: str) -> None:
    import onnx_ir as ir

    mapped: dict = {}  # id(layer-1 value) -> layer-k value
    for past in [v for v in graph.inputs if v.name.startswith("past_key_values.1.")]:
        graph.inputs.append(ir.Value(name=past.name.replace("past_key_values.1.", f"past_key_values.{k}.", 1),
                                     shape=past.shape, type=past.type))
    inputs = {v.name: v for v in graph.inputs}
    for key, value in plan.external.items():
        kind = plan.kind[key]
        if kind == "shared":
            mapped[key] = value
        elif kind == "carry":
            mapped[key] = plan.carry_out if k == UNIT_LAYERS else plan.carry_now
        elif kind == "cache":
            mapped[key] = inputs[value.name.replace("past_key_values.1.", f"past_key_values.{k}.", 1)]
        elif kind == "weight":
            mapped[key] = _layer_weight(graph, value, k, parameters, layer_path)
        else:
            copy = ir.Value(name=f"{value.name}__layer{k}", shape=value.shape, type=value.type,
                            const_value=value.const_value)
            graph.register_initializer(copy)
            mapped[key] = copy
    for node in plan.unit:
        clone = ir.Node(
            node.domain, node.op_type, [None if v is None else mapped[id(v)] for v in node.inputs],
            attributes=list(node.attributes.values()), overload=node.overload, num_outputs=len(node.outputs),
            version=node.version, name=f"{node.name}__layer{k}" if node.name else None,
            metadata_props=dict(node.metadata_props))
        for old, new in zip(node.outputs, clone.outputs):
            new.name = _layer_name(old.name, k)
            new.shape, new.type = old.shape, old.type
            mapped[id(old)] = new
        if plan.tail_first is not None:
            graph.insert_before(plan.tail_first, clone)
        else:
            graph.append(clone)
    plan.carry_now = mapped[id(plan.carry_out)]
    for _, value in sorted(plan.cache_outputs, key=lambda pair: pair[0]):
        present = mapped[id(value)]
        present.name = value.name.replace("present.1.", f"present.{k}.", 1)
        graph.outputs.append(present)


def _layer_name(name: str, k: int) -> str:
    return name.replace("present.1.", f"present.{k}.", 1) if name.startswith("present.1.") else f"{name}__layer{k}"


def _layer_weight(graph, value, k: int, parameters: dict, layer_path: str):
    """Layer ``k``'s counterpart of layer 1's weight ``value``: the module's parameter, transposed
    when written if ``value`` is."""
    import onnx_ir as ir
    from onnx_ir.tensor_adapters import TorchTensor

    source = value.meta.get("source_weight")
    name = (source or value.name).replace(f"{layer_path}.1.", f"{layer_path}.{k}.", 1)
    tensor = parameters.get(name)
    if tensor is None:
        raise NotRepeatable(f"no parameter {name}")
    if source is None:
        new = ir.Value(name=name, shape=value.shape, type=value.type, const_value=TorchTensor(tensor, name=name))
    else:
        from edgebuild_pytorch.onnx_route import transposed_when_written

        new = transposed_when_written(TorchTensor(tensor, name=name), f"{name}__transposed", name)
    graph.register_initializer(new)
    return new


def _finish(plan: _Plan) -> None:
    """The tail reads the last layer's hidden state. (Dims the prelude reads from layer 1's past
    stay so: the whole-model export reads them there too.)"""
    for user, index in plan.tail_uses:
        user.replace_input_with(index, plan.carry_now)
