"""A planned function compiled to one small callable per op over a slot array.

The generic executor looks every value up by its Var in a dict, checks each constant's cache
entry when it is read, looks up the evaluator and conforms every output through the general
path, on every op of every run: for a small conv net that is a quarter of the time. Here that
work is done once: every value gets a slot (an index into a list), each op becomes a closure
with its evaluator, the slots it reads, writes and frees, and its outputs' declared types bound;
the constants are conformed once into a template the run starts from. A run only copies the
template, binds the inputs and calls the closures in order.

Only straight-line functions compile (no cond/while_loop blocks, no states); compressed weights
are expanded into the template (``expand``) while they fit the plan's cache of expanded weights,
else the run is the generic loop's, which frees each after its last reader. The executor runs the
others, and any run with an observer, through
its generic loop. The semantics are the generic loop's: values freed after their last reader,
in-place evaluators handed the inputs nobody else holds, outputs cast to their declared dtype
(and rounded through fp16 when emulating).
"""

from __future__ import annotations

import sys
import weakref
from operator import attrgetter, is_, itemgetter
from typing import Any, Callable

import numpy as np

from edgebuild.plugin import BuildError, EdgebuildError

from . import ort_kernels
from . import torch_kernels as kernels
from .control_flow import BLOCK_EVALUATORS
from .half_rounding import round_to_half
from .fusion import Activation, conv_activations
from . import plan as plan_module
from .plan import Plan, Step, decompresses, is_constant_op, shape_matches, tensor_type_of
from .registry import EVALUATORS, INPLACE, evaluation_failed, no_evaluator

Conform = Callable[[Any, Any, Any], Any]  # (var, declared type, value) -> conformed constant
Expand = Callable[[Any], Any]  # the Var of a ``constexpr_*`` op -> its expanded, conformed value (plan-cached)


class CompiledFunction:
    """The closures of a function's ops, its constants' template and its input/output slots."""

    def __init__(self, plan: Plan, func, conform: Conform, expand: Expand | None = None):
        # held weakly here and by the steps: the plan holds this, and a cycle would keep the
        # template's weights (expanded ones too) alive past ``forget_plans`` until a collection
        plan = weakref.proxy(plan)
        self._plan = plan
        self._conform = conform
        self._expand = expand
        self._expanded: list = []  # the outputs of the ``constexpr_*`` ops, expanded into the template
        self._slot_of: dict = {}
        for var in func.inputs.values():
            self._slot(var)
        constants = []
        self._runs = []
        self._epoch = [0]  # shared with the steps: a new template outdates the calls they prepared
        fused = _fused_activations(func, plan)
        absorbed = {op for activation in fused.values() for op in activation.ops}
        for op in func.operations:  # every value's slot first: a fused step writes a later op's
            for out in op.outputs:
                self._slot(out)
        for op in func.operations:
            if is_constant_op(op):
                constants.extend(op.outputs)
                continue
            if decompresses(op):
                self._expanded.extend(op.outputs)
                continue
            if op in absorbed:  # run by the conv's step
                continue
            activation = fused.get(op)
            step = Step(op, plan.release_of(op), None if activation is None else (activation.output,))
            self._runs.append(_compile_step(step, self._slot_of, plan,
                                            None if activation is None else activation.activation, self._epoch))
        read = {var for op in func.operations if not is_constant_op(op) and not decompresses(op)
                for var in _inputs(op)}
        read.update(func.outputs)
        self._constants = [var for var in constants if var in read]
        self._expanded = [var for var in self._expanded if var in read]
        self._expanded_values: list = []  # their values in the template
        self._outputs = [self._slot_of[var] for var in func.outputs]
        self._template: list | None = None
        self._holders: list = []  # each constant's value holder when the template was made
        # (holders, the values they held then): those read through ``_val``, the others
        self._stored: tuple[list, list] = ([], [])
        self._others: tuple[list, list] = ([], [])

    @staticmethod
    def eligible(func) -> bool:
        """Whether ``func`` is straight-line with an evaluator for every op (else: generic loop)."""
        for op in func.operations:
            if op.blocks or op.op_type in BLOCK_EVALUATORS:
                return False
            if not is_constant_op(op) and EVALUATORS.entry(op.op_type) is None:
                return False
        return True

    def _slot(self, var) -> int:
        slot = self._slot_of.get(var)
        if slot is None:
            slot = self._slot_of[var] = len(self._slot_of)
        return slot

    def run(self, env: dict) -> list | None:
        """Outputs of the function on the bound inputs ``env`` {input Var: value} (consumed), or
        None when its constants do not fit the plan's cache (the caller runs the generic loop)."""
        results = self.run_many([env])
        return None if results is None else results[0]

    def run_many(self, envs: list[dict]) -> list[list] | None:
        """``[run(env) for env in envs]``, each op run on every sample before the next op: a
        small net's time goes mostly to the Python, numpy and oneDNN code around its kernels,
        which stays in the CPU's caches across one op's samples and is evicted by the other
        ops' code within one sample. Each sample's values are its own, so the results are the
        same."""
        first = self._slots()
        if first is None:
            return None
        sample_slots = [first, *(first.copy() for _ in envs[1:])]
        slot_of = self._slot_of
        for slots, env in zip(sample_slots, envs):
            for var, value in env.items():
                slots[slot_of[var]] = value
            env.clear()  # the slots hold the inputs alone: one nobody else holds may be overwritten
        for run in self._runs:
            for slots in sample_slots:
                run(slots)
        return [[slots[i] for i in self._outputs] for slots in sample_slots]

    def _slots(self) -> list | None:
        """A fresh slot list holding every constant, made again when a constant's stored value
        was swapped since (compression's sensitivity analysis does that in place)."""
        template = self._template
        if template is not None and not self._unchanged():
            template = None
        if template is None:
            template = self._make_template()
            if template is None:
                return None
        return template.copy()

    def _make_template(self) -> list | None:
        plan, conform = self._plan, self._conform
        template: list = [None] * len(self._slot_of)
        for var in self._constants:
            value = plan.constant(var, lambda var=var: conform(var, tensor_type_of(var), var.val))
            if plan.cached(var) is not value:  # past the cache's cap (the generic loop frees it), or no value holder
                return None
            template[self._slot_of[var]] = value
        if self._expanded and (self._expand is None or not self._expansions_fit()):
            return None
        expanded = []
        for var in self._expanded:
            value = self._expand(var)
            if plan.cached(var) is not value:  # past the cache's cap: the generic loop expands it per run
                return None
            template[self._slot_of[var]] = value
            expanded.append(value)
        self._expanded_values = expanded
        self._template = template
        self._epoch[0] += 1
        self._holders = [var._sym_val for var in self._constants]
        sources = [holder.val for holder in self._holders]
        # coremltools' tensor and number holders keep their value in ``_val`` behind a Python
        # property: those are read directly (hundreds of property calls a run saved), the others
        # (strings, booleans) through ``val``
        direct = [getattr(holder, "_val", _MISSING) is value for holder, value in zip(self._holders, sources)]
        self._stored = ([h for h, d in zip(self._holders, direct) if d], [v for v, d in zip(sources, direct) if d])
        self._others = ([h for h, d in zip(self._holders, direct) if not d], [v for v, d in zip(sources, direct) if not d])
        return template

    def _expansions_fit(self) -> bool:
        """Whether the compressed weights not expanded yet fit the plan's cache beside those it
        holds, by their declared sizes: else they are not expanded here at all, and the generic
        loop expands each when read and frees it after its last reader."""
        plan, missing = self._plan, 0
        for var in self._expanded:
            if plan.cached(var) is None:
                declared = tensor_type_of(var)
                if declared is None or not all(isinstance(d, (int, np.integer)) for d in declared[1]):
                    return False
                missing += declared[0].itemsize * int(np.prod(declared[1], dtype=np.int64))
        return plan._cached_bytes + missing <= plan_module.EXPANDED_CACHE_BYTES

    def _unchanged(self) -> bool:
        """Whether every constant still holds the value its template entry was made from: the
        same value holder, with the same value in it (checked in C loops: a conv net has hundreds
        of constants, a Python loop over them cost a few percent of its run)."""
        return (all(map(is_, map(_sym_val_of, self._constants), self._holders))
                and all(map(is_, map(_stored_value_of, self._stored[0]), self._stored[1]))
                and all(map(is_, map(_value_of, self._others[0]), self._others[1]))
                and all(map(is_, map(self._plan.cached, self._expanded), self._expanded_values)))


_sym_val_of = attrgetter("_sym_val")
_value_of = attrgetter("val")
_stored_value_of = attrgetter("_val")
_MISSING = object()


def _inputs(op):
    for var in op.inputs.values():
        yield from (var if isinstance(var, (list, tuple)) else (var,))


def _fused_activations(func, plan: Plan) -> dict:
    """{conv op: the activation its step applies} (see ``fusion``), where the conv evaluator
    takes one."""
    entry = EVALUATORS.entry("conv")
    if entry is None or not getattr(entry.obj, "takes_activation", False):
        return {}
    return conv_activations(func, fp16=plan.fp16)


def _compile_step(step: Step, slot_of: dict, plan: Plan, activation: Activation | None = None,
                  epoch: list | None = None) -> Callable[[list], None]:
    """The closure running ``step``: gather, evaluate (with ``activation`` fused into a conv),
    conform, free. An evaluator with a ``prepare(op, args[, activation])`` (conv, reduce) gives
    the call it makes for the op's constants and its input's shape once; the step keeps it and calls it on
    the input alone while the evaluator, the constants' template (``epoch``) and that shape stay
    the same: gathering its args and looking the call up again cost a small conv a tenth of its
    time."""
    op = step.op
    entry = EVALUATORS.entry(step.op_type)  # its evaluator read per call, as the generic loop looks it up
    gather = _gatherer(step, slot_of, plan)
    donors = tuple((name, slot_of[var]) for name, var in step.donors) if step.op_type in INPLACE else ()
    store = _storer(step, slot_of, plan.fp16)
    donor_slots = {slot for _, slot in donors}
    frees = tuple(slot_of[var] for var in step.release if var in slot_of and slot_of[var] not in donor_slots)
    source = dict(step.inputs).get("x")
    preparable = (epoch is not None and not donors and getattr(entry.obj, "prepare", None) is not None
                  and source is not None and not isinstance(source, tuple) and _only_input_varies(step))
    input_slot = slot_of.get(source) if preparable else None
    if input_slot is None and not donors and activation is None:
        return _plain_run(op, entry, gather, store, frees)
    prepared = _PreparedCall()

    def run(slots: list) -> None:
        try:
            evaluator = entry.obj
            if evaluator is None:
                raise no_evaluator(op)
            if (input_slot is not None and not prepared.fits(evaluator, slots[input_slot], epoch[0])
                    and prepared.wanted(evaluator, epoch[0])):  # made before its first call: every run takes it
                prepared.keep(evaluator, op, gather(slots), activation, epoch[0])
            if input_slot is not None and prepared.fits(evaluator, slots[input_slot], epoch[0]):
                results = prepared.call(slots[input_slot])
            else:
                args = gather(slots)
                if donors:
                    donated = set()
                    for name, slot in donors:
                        slots[slot] = None  # read by no later op: now only ``args`` holds it
                        value = args[name]
                        if sys.getrefcount(value) == 3 and _owns_writable_memory(value):  # args, value, the call
                            donated.add(name)
                    del value
                    results = evaluator(op, args, donated=donated)
                elif activation is not None:
                    results = evaluator(op, args, activation=activation)
                else:
                    results = evaluator(op, args)
        except EdgebuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - report which op broke, keep the cause
            raise evaluation_failed(op, exc) from exc
        store(slots, results)
        for slot in frees:
            slots[slot] = None

    return run


def _plain_run(op, entry, gather, store, frees: tuple) -> Callable[[list], None]:
    """``_compile_step``'s closure for a step with nothing to prepare, donate or fuse (most
    small ops): the same gather, evaluate, conform and free, with none of the others' checks."""

    def run(slots: list) -> None:
        try:
            evaluator = entry.obj
            if evaluator is None:
                raise no_evaluator(op)
            results = evaluator(op, gather(slots))
        except EdgebuildError:
            raise
        except Exception as exc:  # noqa: BLE001 - report which op broke, keep the cause
            raise evaluation_failed(op, exc) from exc
        store(slots, results)
        for slot in frees:
            slots[slot] = None

    return run


_FLOAT32 = np.dtype(np.float32)
_PREPARED_TYPES = (_FLOAT32, np.dtype(np.float16))  # an fp16 program's activations too: its ops widen them


def _only_input_varies(step: Step) -> bool:
    """Whether every argument of ``step`` but its input ``x`` is a constant (or an expanded
    weight): a prepared call keeps them, so a weight fed at run time (a conv whose kernel is a
    graph input) must be read afresh every call."""
    for name, var in step.inputs:
        if name == "x" or var is None:
            continue
        if isinstance(var, tuple) or var.op is None or not (is_constant_op(var.op) or decompresses(var.op)):
            return False
    return True


def _kernel_choice() -> tuple[bool, bool]:
    """Whether torch's and onnxruntime's kernels are on for the calling thread: what a prepared
    call chose its kernels by."""
    return kernels.enabled(), ort_kernels.active()


class _PreparedCall:
    """The call an evaluator's ``prepare`` gave a step (see ``_compile_step``), and what it was
    made for: the evaluator, the constants' template, the float input's type and shape and
    whether torch's and onnxruntime's kernels were on (the call chose between theirs and numpy's)."""

    __slots__ = ("evaluator", "epoch", "dtype", "shape", "kernel_choice", "call")

    def __init__(self):
        self.evaluator = self.epoch = self.dtype = self.shape = self.kernel_choice = self.call = None

    def fits(self, evaluator, value, epoch: int) -> bool:
        return (self.call is not None and self.evaluator is evaluator and self.epoch == epoch
                and getattr(value, "dtype", None) == self.dtype and value.shape == self.shape
                and _kernel_choice() == self.kernel_choice)

    def wanted(self, evaluator, epoch: int) -> bool:
        """Whether to ask ``evaluator`` for a call: not again once it declined for this template."""
        return not (self.call is None and self.evaluator is evaluator and self.epoch == epoch)

    def keep(self, evaluator, op, args: dict, activation: Activation | None, epoch: int) -> None:
        value, prepare = args.get("x"), getattr(evaluator, "prepare", None)
        call = None
        if prepare is not None and getattr(value, "dtype", None) in _PREPARED_TYPES:
            call = prepare(op, args, activation) if activation is not None else prepare(op, args)
        self.evaluator, self.epoch, self.call = evaluator, epoch, call
        self.dtype, self.shape = getattr(value, "dtype", None), getattr(value, "shape", None)
        self.kernel_choice = _kernel_choice()


def _gatherer(step: Step, slot_of: dict, plan: Plan) -> Callable[[list], dict]:
    """A function from the slots to the evaluator's args {param name: value}."""
    names = tuple(name for name, _ in step.inputs)
    lists = any(isinstance(var, tuple) for _, var in step.inputs)
    # fp16 weights of an op that computes in fp32: widened once per plan (see Plan.widened)
    widened = tuple((name, var) for name, var in step.inputs
                    if step.widens and not isinstance(var, tuple) and var.op is not None
                    and (is_constant_op(var.op) or decompresses(var.op)) and _declared_dtype(var) == np.float16)
    if lists:
        reads = tuple((name, tuple(slot_of[v] for v in var) if isinstance(var, tuple) else slot_of[var])
                      for name, var in step.inputs)

        def gather(slots):
            return {name: [slots[i] for i in slot] if isinstance(slot, tuple) else slots[slot]
                    for name, slot in reads}
    elif len(names) == 1:
        [name], slot = names, slot_of[step.inputs[0][1]]

        def gather(slots):
            return {name: slots[slot]}
    elif names:
        values = itemgetter(*(slot_of[var] for _, var in step.inputs))

        def gather(slots):
            return dict(zip(names, values(slots)))
    else:
        def gather(slots):
            return {}
    if not widened:
        return gather

    def gather_widened(slots):
        args = gather(slots)
        for name, var in widened:
            value = args[name]
            if getattr(value, "dtype", None) == np.float16:
                wide = plan.widened(var, value)
                if wide is not None:
                    args[name] = wide
        return args

    return gather_widened


def _declared_dtype(var):
    declared = tensor_type_of(var)
    return None if declared is None else declared[0]


def _storer(step: Step, slot_of: dict, fp16: bool) -> Callable[[list, Any], None]:
    """A function writing an evaluator's results, conformed to their declared types, to the slots."""
    op = step.op
    conformers = tuple((slot_of[out], _conformer(op, out, declared, fp16)) for out, declared, _ in step.outputs)
    if len(conformers) == 1 and not step.outputs[0][2]:
        [(slot, conform)] = conformers

        def store_one(slots, result):
            if isinstance(result, (tuple, list)):
                if len(result) != 1:
                    raise _arity_error(op, len(result))
                result = result[0]
            slots[slot] = conform(result)

        return store_one
    if len(conformers) == 1:
        [(slot, conform)] = conformers

        def store_list(slots, result):
            slots[slot] = conform(result)

        return store_list

    def store_many(slots, results):
        if len(results) != len(conformers):
            raise _arity_error(op, len(results))
        for (slot, conform), value in zip(conformers, results):
            slots[slot] = conform(value)

    return store_many


def _arity_error(op, got: int) -> BuildError:
    return BuildError(f"MIL interpreter: evaluator for {op.op_type!r} returned {got} values, "
                      f"op {op.name!r} has {len(op.outputs)} outputs")


def _conformer(op, var, declared, fp16: bool) -> Callable[[Any], Any]:
    """``value`` -> ``value`` cast to ``var``'s declared dtype (and fp16-rounded if emulating),
    its shape checked against the declared one."""
    if declared is None:
        return lambda value: value
    dtype, shape = declared
    rounds = fp16 and dtype == np.float32
    static = tuple(int(d) for d in shape) if all(isinstance(d, (int, np.integer)) for d in shape) else None
    ndarray, cast = np.ndarray, kernels.cast

    def conform(value):
        array = value if isinstance(value, ndarray) else np.asarray(value)
        if array.shape != static and (static is not None or not shape_matches(array.shape, shape)):
            raise BuildError(f"MIL interpreter: op {op.name!r} ({op.op_type}) produced shape "
                             f"{array.shape} for {var.name!r}, which is declared {tuple(shape)}")
        if array.dtype != dtype:
            array = cast(array, dtype)
        if rounds:
            array = round_to_half(array)
        return array

    return conform


def _owns_writable_memory(value) -> bool:
    """Whether ``value`` (held only by the caller) is the one holder of its memory: an array of
    its own, or a channels-last view over the whole of an array nobody else holds (a 1x1 conv's
    ``[pixels, F]`` product; other views, a transpose's, stay unwritten: their strided layout
    would outlive the op)."""
    if not isinstance(value, np.ndarray) or not value.flags.writeable:
        return False
    base = value.base
    if base is None:
        return True
    # ``base`` held by ``value``, this frame and the call
    return (type(base) is np.ndarray and base.base is None and base.nbytes == value.nbytes
            and kernels.channels_last(value) and sys.getrefcount(base) == 3)
