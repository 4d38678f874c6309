"""A decoder with an explicit KV cache (past inputs, present outputs) lowered as a stateful program.

The artifact takes ``input_ids`` int32 [1, Q] and ``position`` int32 [1] (tokens already cached);
each cache pair becomes one Core ML state [1, Hkv, max_context, D]. Around the plain lowered graph:

- each past input is the state read up to ``position`` (cast to the compute dtype); a past input
  whose length is fixed at ``max_context`` (a decoder that writes its new rows into a whole-length
  cache itself, as a JAX step function with ``dynamic_update_slice`` does) gets the whole state;
- ``attention_mask`` (ones over position + Q), ``position_ids`` (position .. position + Q - 1),
  GroupQueryAttention's ``seqlens_k`` / ``total_sequence_length`` and a ``position`` input (0-d or
  [1]) are derived from position and Q;
- after the graph, the new rows of each present output (rows position .. position + Q) are written
  back into its state (``slice_update`` + ``coreml_update_state``);
- ``logits: last_token`` keeps only the last position.

States are float16: coremltools 9 refuses any other state dtype when it serializes the program
("State only support fp16 dtype", ``backend/mil/load.py``), and Core ML's iOS18 state features
are specified for float16. The fp32 variant computes in fp32 and rounds only the cache to fp16.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import get_new_symbol, types

from edgebuild.plugin import BuildError, RecipeError
from edgebuild.plugin.recipe import DERIVED_INPUTS, GenerateSection, cache_pairs, describe
from edgebuild_coreml.lowering.names import sanitized

INPUT_IDS, POSITION = "input_ids", "position"
STATE_DTYPE = types.fp16
METADATA_KEY = "edgebuild.generate"


@dataclass
class StatefulPlan:
    """What the wrapper feeds and writes: cache pairs with their state names and shapes."""

    section: GenerateSection
    pairs: list[tuple[str, str]]  # (past input, present output)
    states: dict[str, str] = field(default_factory=dict)  # past input -> state name
    shapes: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # past input -> state shape
    whole: set[str] = field(default_factory=set)  # past inputs that take the whole state (max_context rows)
    vocab: int | None = None  # the logits' last dim, when the graph says

    def calibration_samples(self):
        """Inputs for the fp16 guard: a seeded random prompt of each query length (longest first,
        at most four), fed at position 0 to an empty cache."""
        rng = np.random.default_rng(0)
        high = self.vocab or 2
        for length in self.section.lengths()[:4]:
            yield {INPUT_IDS: rng.integers(0, high, (1, length)).astype(np.int32),
                   POSITION: np.zeros(1, np.int32)}

    def description(self) -> dict:
        return describe(self.section, self.pairs, self.states)

    def input_specs(self) -> dict:
        """``save_mlpackage`` input specs: enumerated or ranged Q on input_ids, position fixed."""
        lengths = self.section.query_lengths
        if isinstance(lengths, list):
            ids = {"shapes": [[1, q] for q in sorted(lengths)]} if len(lengths) > 1 else [1, lengths[0]]
        else:
            lo, hi = lengths.range
            ids = [1, [lo, hi]] if lo < hi else [1, lo]
        return {INPUT_IDS: ids, POSITION: [1]}


def plan_for(graph: ir.Graph, section: GenerateSection | dict, taken: set[str]) -> StatefulPlan:
    """Pair the cache, check the graph's other inputs, and size each state."""
    if isinstance(section, dict):
        section = GenerateSection.model_validate(section)
    inputs = [v.name for v in graph.inputs if v.name not in graph.initializers]
    outputs = [v.name for v in graph.outputs]
    try:
        pairs = cache_pairs(section, inputs, outputs)
    except RecipeError as exc:
        raise BuildError(f"generate.cache: {exc.message}", hint=exc.hint) from None
    plan = StatefulPlan(section, pairs)
    logits = next((v for v in graph.outputs if v.name == "logits"), None)
    if logits is not None and logits.shape is not None and isinstance(logits.shape[-1], int):
        plan.vocab = int(logits.shape[-1])
    by_name = {v.name: v for v in graph.inputs}
    cached = {past for past, _ in pairs}
    if INPUT_IDS not in by_name:
        raise BuildError(f"a generative model takes input_ids; this one takes {', '.join(inputs)}")
    others = [n for n in inputs if n not in cached and n != INPUT_IDS and n not in DERIVED_INPUTS]
    if others:
        raise BuildError(f"generate: the decoder's input(s) {', '.join(others)} are neither input_ids, a cache "
                         f"input nor one the artifact derives ({', '.join(DERIVED_INPUTS)})",
                         hint="fix them in the recipe with source.inputs.NAME.value")
    for past, _ in pairs:
        shape = by_name[past].shape
        dims = list(shape) if shape is not None else []
        if len(dims) == 4 and not isinstance(dims[3], int):
            dims[3] = gqa_head_size(by_name[past]) or dims[3]
        if len(dims) != 4 or not all(isinstance(d, int) for d in (dims[1], dims[3])):
            raise BuildError(f"cache input {past!r} has shape {dims or 'unknown'}; a KV cache input is "
                             "[batch, kv_heads, past, head_dim] with kv_heads and head_dim fixed")
        if isinstance(dims[2], int):  # a whole-length cache: the decoder writes its rows at position
            if dims[2] != section.max_context:
                raise BuildError(f"cache input {past!r} holds {dims[2]} positions, and generate.max_context is "
                                 f"{section.max_context}; a cache of fixed length is the whole state",
                                 hint=f"set generate.max_context: {dims[2]}, or export the decoder with a cache "
                                      "of that length")
            plan.whole.add(past)
        plan.shapes[past] = (1, int(dims[1]), section.max_context, int(dims[3]))
        plan.states[past] = sanitized(past, taken)
    return plan


def gqa_head_size(past: ir.Value) -> int | None:
    """The head size of a cache input that feeds GroupQueryAttention (onnxruntime-genai's graphs
    leave the cache's last dim symbolic): the query width over the heads, packed QKV or not."""
    for node, index in past.uses():
        if node.op_type != "GroupQueryAttention" or index not in (3, 4):
            continue
        attributes = node.attributes
        heads, kv_heads = attributes["num_heads"].as_int(), attributes["kv_num_heads"].as_int()
        query = node.inputs[0]
        packed = len(node.inputs) < 2 or node.inputs[1] is None
        width = query.shape[-1] if query is not None and query.shape is not None else None
        if isinstance(width, int):
            return width // (heads + 2 * kv_heads) if packed else width // heads
    return None


def placeholders(plan: StatefulPlan) -> dict:
    """The program's inputs: input_ids [1, Q], position [1] and one fp16 state per cache pair."""
    query = get_new_symbol()
    result = {INPUT_IDS: mb.placeholder(shape=(1, query), dtype=types.int32),
              POSITION: mb.placeholder(shape=(1,), dtype=types.int32)}
    for past, name in plan.states.items():
        result[name] = mb.state_tensor_placeholder(shape=plan.shapes[past], dtype=STATE_DTYPE)
    return result


class StatefulWrapper:
    """Binds the graph's inputs from the program's inputs and states, and writes the states back."""

    def __init__(self, plan: StatefulPlan, function, graph: ir.Graph):
        self.plan, self.function, self.graph = plan, function, graph
        self.read: dict[str, object] = {}  # past input -> the whole state as read (fp16)

    def bind_inputs(self, ctx) -> None:
        inputs = self.function.inputs
        ids, position = inputs[INPUT_IDS], inputs[POSITION]
        query = mb.slice_by_index(x=mb.shape(x=ids), begin=[1], end=[2], name="generate_query_length")
        self.position = position
        self.end = mb.add(x=position, y=query, name="generate_total_length")  # [1]: tokens after this call
        start_scalar = mb.squeeze(x=position, name="generate_position_scalar")
        end_scalar = mb.squeeze(x=self.end, name="generate_total_scalar")
        derived = {
            "attention_mask": lambda: mb.fill(shape=mb.concat(values=[np.array([1], np.int32), self.end], axis=0),
                                              value=np.int32(1), name="generate_attention_mask"),
            "position_ids": lambda: mb.expand_dims(x=mb.range_1d(start=start_scalar, end=end_scalar, step=np.int32(1)),
                                                   axes=[0], name="generate_position_ids"),
            "seqlens_k": lambda: mb.sub(x=self.end, y=np.int32(1), name="generate_seqlens_k"),
            "total_sequence_length": lambda: mb.identity(x=end_scalar, name="generate_total_sequence_length"),
            "position": lambda: mb.identity(x=position, name="generate_position"),
        }
        for value in self.graph.inputs:
            name = value.name
            if name in ctx.consts:
                continue
            if name == INPUT_IDS:
                ctx.set(value, ids)
            elif name in self.plan.states:
                ctx.set(value, self._past(name, value))
            elif name in derived:
                var = derived[name]()
                if name == "total_sequence_length" and value.shape is not None and value.shape.rank() == 1:
                    var = mb.expand_dims(x=var, axes=[0])
                if name == "position":
                    var = self._as_position(value, var)
                ctx.set(value, var)

    @staticmethod
    def _as_position(value: ir.Value, var):
        """``position`` [1] in the rank the graph's input has (int32, as the lowering keeps every
        integer, like the derived position_ids)."""
        if value.shape is not None and value.shape.rank() == 0:
            var = mb.squeeze(x=var, name="generate_position_0d")
        return var

    def _past(self, name: str, value: ir.Value):
        _, heads, _, dim = self.plan.shapes[name]
        state = self.function.inputs[self.plan.states[name]]
        whole = mb.read_state(input=state, name=f"{self.plan.states[name]}_read")
        self.read[name] = whole
        dtype = "fp16" if value.dtype == ir.DataType.FLOAT16 else "fp32"
        if name in self.plan.whole:
            return mb.cast(x=whole, dtype=dtype, name=f"{self.plan.states[name]}_past")
        end = mb.concat(values=[np.array([1, heads], np.int32), self.position, np.array([dim], np.int32)], axis=0)
        past = mb.slice_by_index(x=whole, begin=np.zeros(4, np.int32), end=end)
        # A run-time end leaves every dim of the slice symbolic: only the past length is unknown.
        past = mb.reshape(x=past, shape=[1, heads, -1, dim])
        return mb.cast(x=past, dtype=dtype, name=f"{self.plan.states[name]}_past")

    def write_states(self, ctx) -> None:
        """Write rows position .. position + Q of every present output into its state (a whole-length
        present holds them at the same rows)."""
        zero2 = np.zeros(2, np.int32)
        for past, present in self.plan.pairs:
            _, heads, _, dim = self.plan.shapes[past]
            produced = ctx.get(self.graph_output(present))
            begin = mb.concat(values=[zero2, self.position, np.zeros(1, np.int32)], axis=0)
            end = mb.concat(values=[np.array([1, heads], np.int32), self.end, np.array([dim], np.int32)], axis=0)
            rows = mb.cast(x=mb.slice_by_index(x=produced, begin=begin, end=end), dtype="fp16")
            updated = mb.slice_update(x=self.read[past], update=rows, begin=begin, end=end)
            mb.coreml_update_state(state=self.function.inputs[self.plan.states[past]], value=updated,
                                   name=f"{self.plan.states[past]}_write")

    def graph_output(self, name: str) -> ir.Value:
        return next(v for v in self.graph.outputs if v.name == name)

    def output_values(self) -> list[ir.Value]:
        """The graph outputs the artifact returns: everything but the present cache."""
        presents = {present for _, present in self.plan.pairs}
        return [v for v in self.graph.outputs if v.name not in presents]

    def shape_output(self, value: ir.Value, var):
        """``logits: last_token``: only the last position's logits, [1, 1, V]."""
        if value.name == "logits" and self.plan.section.logits == "last_token":
            return mb.slice_by_index(x=var, begin=[0, -1, 0], end=[1, 0, 0], end_mask=[True, True, True])
        return var
