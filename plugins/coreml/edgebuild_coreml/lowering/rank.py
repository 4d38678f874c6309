"""Core ML holds tensors of rank <= 5: fold adjacent dims of higher-rank values so none is left.

Window attention (Swin, MaxViT), optical-flow correlation and Gathers with 2-D indices on 5-D data
make rank-6 intermediates that the data layout does not need: the dims an op works on (a softmax
axis, a gather axis, a matmul's matrix dims, a broadcast operand's missing dims) must stay apart,
and every other run of adjacent dims can be one dim. Each dim boundary of each such value is a
"cut" that may be kept or folded; an op ties the cuts of its operands and results together (an
elementwise op's cuts are its operands' cuts) or forces one (the dims around a softmax axis).
Folding every cut no op forces is the fewest dims; when a value still has more than five, the
build stops here, naming the node, the shape and the ops that keep the dims apart.

Reshapes and transposes pass no constraint on: a reshape's target becomes the folded shape, and a
transpose becomes reshape -> transpose(s) of rank <= 5 -> reshape (the chain of rank-4 transposes
coremltools' ``expand_high_rank_reshape_and_transpose`` uses, for permutations of more than five
runs). The pass runs on the lowered MIL program, where pinned input shapes make every dim known,
before any coremltools pass (its type inference accepts rank 6; only its final check refuses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.types.symbolic import any_symbolic
from coremltools.converters.mil.mil.var import ListVar, Var

from edgebuild_coreml.lowering.errors import DeclinedForm

MAX_RANK = 5

ELEMENTWISE = frozenset({
    # broadcasting binary / ternary ops
    "add", "sub", "mul", "real_div", "floor_div", "pow", "maximum", "minimum", "mod", "equal", "not_equal",
    "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor", "select",
    # unary ops (their other inputs are scalars or strings)
    "identity", "cast", "relu", "relu6", "exp", "exp2", "log", "sqrt", "rsqrt", "abs", "erf", "sigmoid", "tanh",
    "gelu", "silu", "clip", "clamped_relu", "inverse", "square", "sign", "floor", "ceil", "round", "logical_not",
    "leaky_relu", "elu", "softplus", "softsign", "sigmoid_hard", "scaled_tanh", "linear_activation", "threshold",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
})
# the inputs that are data (folded with the op's dims); every other input is a parameter
DATA_INPUTS = frozenset({"x", "y", "values", "indices", "cond", "a", "b"})
RESHAPES = frozenset({"reshape", "expand_dims", "squeeze", "flatten2d"})
REDUCTIONS = frozenset({
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_l1_norm", "reduce_l2_norm",
    "reduce_log_sum", "reduce_log_sum_exp", "reduce_sum_square", "reduce_argmax", "reduce_argmin",
})
# one axis kept apart, every operand of the output's rank alike
AXIS_OPS = frozenset({"softmax", "concat", "split", "cumsum", "topk", "argsort", "gather_along_axis"})


class _Cuts:
    """Union-find over dim boundaries; a class of boundaries is cut when an op forces one of them."""

    def __init__(self):
        self.parent: list[int] = []
        self.forced: dict[int, list[tuple]] = {}  # root -> (why, op) of the ops that force it

    def new(self, count: int) -> list[int]:
        start = len(self.parent)
        self.parent.extend(range(start, start + count))
        return list(range(start, start + count))

    def find(self, slot: int) -> int:
        while self.parent[slot] != slot:
            self.parent[slot] = self.parent[self.parent[slot]]
            slot = self.parent[slot]
        return slot

    def tie(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[b] = a
            if b in self.forced:
                self.forced.setdefault(a, []).extend(self.forced.pop(b))

    def force(self, slot: int, why: str) -> None:
        self.forced.setdefault(self.find(slot), []).append((why, self.current))

    current = None  # the op whose constraints are being added (named in errors)

    def is_cut(self, slot: int) -> bool:
        return self.find(slot) in self.forced


@dataclass
class _Operand:
    """A tensor an op reads or writes, with the cut slots it has in this op (shared when ``var`` is
    a high-rank value, the op's own for a low-rank one)."""

    var: object
    shape: tuple
    slots: list[int]
    broadcast: bool = False  # a constant stored broadcast to ``shape`` (its own shape folds no further)

    def groups(self, cuts: _Cuts) -> list[list[int]]:
        if not self.shape:
            return []
        groups = [[0]]
        for dim, slot in enumerate(self.slots, start=1):
            if cuts.is_cut(slot):
                groups.append([dim])
            else:
                groups[-1].append(dim)
        return groups

    def folded_shape(self, cuts: _Cuts) -> list[int]:
        return [math.prod(self.shape[d] for d in group) for group in self.groups(cuts)]

    def group_of(self, cuts: _Cuts, dim: int) -> int:
        return next(i for i, group in enumerate(self.groups(cuts)) if dim in group)


@dataclass
class _OpPlan:
    op: object
    inputs: dict[str, _Operand | list[_Operand]] = field(default_factory=dict)
    outputs: list[_Operand] = field(default_factory=list)


class RankLegaliser:
    """Folds the dims of every value of rank > ``MAX_RANK`` in ``function``'s main block; see the module."""

    def __init__(self, function, where=None, broadcast_constants: bool = False):
        self.function = function
        self.block = function
        self.where = where or (lambda op: f"op {op.name!r} ({op.op_type})")
        # Constants an elementwise op broadcasts are stored at full size instead (their dims then
        # fold with the op's): the second try, when folding fails without it.
        self.broadcast_constants = broadcast_constants
        self.cuts = _Cuts()
        self.slots: dict[int, list[int]] = {}  # id(high-rank var) -> its slots
        self.plans: list[_OpPlan] = []

    # -- which values ---------------------------------------------------------------------
    @staticmethod
    def high(var) -> bool:
        return _is_tensor(var) and var.rank > MAX_RANK and not _is_const(var)

    def _operand(self, var) -> _Operand:
        shape = tuple(var.shape)
        if self.high(var):
            slots = self.slots.setdefault(id(var), self.cuts.new(max(len(shape) - 1, 0)))
        else:
            slots = self.cuts.new(max(len(shape) - 1, 0))
        return _Operand(var, shape, slots)

    # -- the pass -------------------------------------------------------------------------
    def run(self) -> int:
        """Legalise; returns the number of high-rank values folded (0: nothing to do)."""
        touched = self._touched_ops()
        if not touched:
            return 0
        self._check_boundaries(touched)
        for op in touched:
            self.plans.append(self._constrain(op))
        try:
            self._check_ranks()
        except DeclinedForm:
            if self.broadcast_constants or not self._broadcast_constant_count:
                raise
            return RankLegaliser(self.function, self.where, broadcast_constants=True).run()
        existing = {id(op) for op in self.block.operations}
        with self.block:
            self._rewrite()
        # the reshapes a later reshape read through
        made = [op for op in self.block.operations if id(op) not in existing]
        for op in reversed(made):
            if not any(v.child_ops or v in self.block.outputs for v in op.outputs):
                self.block.remove_ops([op])
        return len(self.slots)

    def _touched_ops(self) -> list:
        touched = []
        for op in _all_ops(self.block):
            vars_ = [*_input_vars(op), *op.outputs]
            if any(self.high(v) for v in vars_):
                touched.append(op)
        return touched

    def _check_boundaries(self, touched) -> None:
        for op in touched:
            if op.enclosing_block is not self.block:
                self._decline(op, self._high_of(op), "it is inside a control-flow body, where edgebuild does not "
                              "fold dims")
            for var in (*_input_vars(op), *op.outputs):
                if self.high(var) and any(s is None or not isinstance(s, (int, np.integer)) for s in var.shape):
                    self._decline(op, var, "its shape is not static, so its dims cannot be folded",
                                  hint="pin every input shape in the recipe's source.inputs")
        for var in self.block.outputs:
            if self.high(var):
                self._decline(_producer(var), var, "it is a model output, and Core ML outputs hold rank <= 5",
                              hint="reshape the output to rank 5 or less in the source model")
        for name, var in self.function.inputs.items():
            if self.high(var):
                self._decline(None, var, "Core ML inputs hold rank <= 5 too", hint="feed the input at rank 5 or less",
                              what=f"model input {name!r} is")

    def _high_of(self, op):
        return next(v for v in (*op.outputs, *_input_vars(op)) if self.high(v))

    def _check_ranks(self) -> None:
        for plan in self.plans:
            for operand in [*plan.outputs, *_flat(plan.inputs.values())]:
                if not self.high(operand.var):
                    continue
                groups = operand.groups(self.cuts)
                if len(groups) > MAX_RANK:
                    why = sorted({w.format(op=self.where(o)) for slot in operand.slots if self.cuts.is_cut(slot)
                                  for w, o in self.cuts.forced[self.cuts.find(slot)]})
                    producer = operand.var.op if operand.var.op is not None else plan.op
                    self._decline(
                        producer, operand.var,
                        f"edgebuild could not fold its dims: the ops reading and writing it keep {len(groups)} "
                        f"of them apart ({'; '.join(why[:6])}{'; ...' if len(why) > 6 else ''})",
                        hint="reshape the tensor to rank 5 or less in the source model around those ops, or "
                             "route them to another backend with the recipe's compute policy")

    def _decline(self, op, var, reason: str, hint: str | None = None, what: str | None = None):
        shape = list(var.shape)
        what = what or f"{self.where(op)} makes"
        message = f"{what} a rank-{len(shape)} tensor {shape}; Core ML holds rank <= {MAX_RANK}, and {reason}"
        raise DeclinedForm(message, hint=hint or "reshape the tensor to rank 5 or less in the source model",
                           reason=f"a rank-{len(shape)} tensor {shape}: {reason}")

    # -- constraints, per op kind -----------------------------------------------------------
    def _constrain(self, op) -> _OpPlan:
        kind = op.op_type
        plan = _OpPlan(op)
        for name, value in op.inputs.items():
            if name not in DATA_INPUTS:  # a parameter (a weight, an axis, pads): rebuilt by the rule, or kept
                high = [v for v in (value if isinstance(value, (list, tuple)) else (value,)) if self.high(v)]
                if high:
                    self._unsupported(op, f"its {name} is a rank-{high[0].rank} value")
                continue
            if isinstance(value, (list, tuple)):
                plan.inputs[name] = [self._operand(v) if _is_tensor(v) else v for v in value]
            elif _is_tensor(value) and value.rank >= 1:
                plan.inputs[name] = self._operand(value)
        plan.outputs = [self._operand(v) for v in op.outputs]
        label = "{op}"  # the node, named only if an error needs it
        self.cuts.current = op
        if kind in ELEMENTWISE:
            self._broadcast(plan.outputs[0], [o for o in plan.inputs.values() if isinstance(o, _Operand)], label)
        elif kind in RESHAPES or kind in ("transpose", "shape"):
            pass  # layout only: no cut passes through
        elif kind in AXIS_OPS:
            operands = [*plan.outputs, *(o for o in _flat(plan.inputs.values()) if isinstance(o, _Operand))]
            operands = [o for o in operands if len(o.shape) == len(plan.outputs[0].shape)]
            if kind == "concat" and _value(op, "interleave", False):
                self._unsupported(op, "interleave=True")
            axis = _axis(_value(op, "axis"), len(plan.outputs[0].shape))
            self._tie_all(operands, label)
            self._keep_apart(operands[0], [axis], f"{label} works along axis {axis}")
        elif kind in REDUCTIONS:
            self._reduction(op, plan, label)
        elif kind == "layer_norm":
            x, y = plan.inputs["x"], plan.outputs[0]
            axes = _axes(_value(op, "axes"), len(x.shape))
            self._tie_all([x, y], label)
            self._keep_apart(x, axes, f"{label} normalises axes {axes}", together=True)
        elif kind == "matmul":
            self._matmul(op, plan, label)
        elif kind == "linear":  # x [..., in] with a constant weight [out, in]: the last dim is the op's
            x, y = plan.inputs["x"], plan.outputs[0]
            self._tie_all([x, y], label)
            self._keep_apart(x, [len(x.shape) - 1], f"{label} multiplies its last dim")
        elif kind == "pad":
            x, y = plan.inputs["x"], plan.outputs[0]
            pads = [int(p) for p in _value(op, "pad")]
            padded = len(pads) // 2
            axes = [len(x.shape) - padded + i for i in range(padded) if pads[2 * i] or pads[2 * i + 1]]
            self._tie_all([x, y], label)
            self._keep_apart(x, axes, f"{label} pads axes {axes}")
        elif kind == "gather":
            self._gather(op, plan, label)
        elif kind == "stack":  # a new axis in the output: kept apart, the inputs' dims either side of it too
            out = plan.outputs[0]
            axis = _axis(_value(op, "axis"), len(out.shape))
            self._keep_apart(out, [axis], f"{label} stacks along axis {axis}")
            for value in plan.inputs["values"]:
                for k, slot in enumerate(value.slots):
                    if k + 1 < axis:
                        self.cuts.tie(slot, out.slots[k])
                    elif k >= axis:
                        self.cuts.tie(slot, out.slots[k + 1])
                    else:
                        self.cuts.force(slot, f"{label} stacks along axis {axis}")
        elif kind == "slice_by_index" or kind == "slice_by_size":
            x, y = plan.inputs["x"], plan.outputs[0]
            if kind == "slice_by_index" and _value(op, "squeeze_mask") is not None and any(_value(op, "squeeze_mask")):
                self._unsupported(op, "a slice that squeezes axes")
            sliced = _sliced_axes(op, x.shape)
            self._tie_all([x, y], label)
            self._keep_apart(x, sliced, f"{label} slices axes {sliced}")
        elif kind == "tile":
            x, y = plan.inputs["x"], plan.outputs[0]
            reps = [int(r) for r in _value(op, "reps")]
            self._tie_all([x, y], label)
            self._keep_apart(x, [i for i, r in enumerate(reps) if r != 1], f"{label} repeats its axes")
        else:
            self._unsupported(op, "edgebuild does not fold dims through this op")
        return plan

    def _unsupported(self, op, why: str):
        var = self._high_of(op)
        self._decline(op, var, f"edgebuild could not fold its dims: {why} ({self.where(op)})",
                      hint="reshape the tensor to rank 5 or less in the source model, or route the op to another "
                           "backend with the recipe's compute policy")

    def _tie_all(self, operands: list[_Operand], label: str) -> None:
        first = operands[0]
        for other in operands[1:]:
            if len(other.shape) != len(first.shape):
                continue
            for a, b in zip(first.slots, other.slots):
                self.cuts.tie(a, b)

    def _keep_apart(self, operand: _Operand, axes, why: str, together: bool = False) -> None:
        """Cut around each of ``axes`` (``together``: adjacent axes of the set may stay one dim)."""
        axes = set(axes)
        for dim, slot in enumerate(operand.slots):
            left, right = dim in axes, dim + 1 in axes
            if (left != right) if together else (left or right):
                self.cuts.force(slot, why)

    def _broadcast(self, out: _Operand, operands: list[_Operand], label: str, whole: bool = True) -> None:
        """Numpy broadcasting of ``operands`` to ``out``: a folded dim of an operand must be all its
        own dims or all broadcast ones (size-1 dims go with either). ``whole``: the operands are whole
        tensors (not a matmul's batch dims), so a constant among them may be stored broadcast."""
        rank = len(out.shape)
        for operand in operands:
            if whole and _is_const(operand.var) and tuple(operand.shape) != tuple(out.shape):
                self._broadcast_constant_count += 1
                if self.broadcast_constants:
                    operand.shape, operand.slots, operand.broadcast = tuple(out.shape), self.cuts.new(rank - 1), True
            offset = rank - len(operand.shape)
            for j, slot in enumerate(operand.slots):
                self.cuts.tie(slot, out.slots[offset + j])
            status = []
            for k in range(rank):
                mine = operand.shape[k - offset] if k >= offset else 1
                status.append("one" if out.shape[k] == 1 else ("own" if mine == out.shape[k] else "broadcast"))
            filled = _fill_ones(status)
            for k in range(rank - 1):
                if filled[k] != filled[k + 1]:
                    self.cuts.force(out.slots[k], f"{label} broadcasts some of these dims, not others")

    _broadcast_constant_count = 0

    def _reduction(self, op, plan: _OpPlan, label: str) -> None:
        x, y = plan.inputs["x"], plan.outputs[0]
        rank = len(x.shape)
        if op.op_type in ("reduce_argmax", "reduce_argmin"):
            axes = [_axis(_value(op, "axis", -1), rank)]
        else:
            axes = _axes(_value(op, "axes"), rank)
        keep = bool(_value(op, "keep_dims", False))
        reduced = set(axes)
        self._keep_apart(x, reduced, f"{label} reduces axes {sorted(reduced)}", together=True)
        if keep:
            self._tie_all([x, y], label)
            return
        kept = [d for d in range(rank) if d not in reduced]
        for j in range(len(kept) - 1):
            if kept[j + 1] == kept[j] + 1:
                self.cuts.tie(x.slots[kept[j]], y.slots[j])
            else:
                self.cuts.force(y.slots[j], f"{label} removes the axes between these dims")

    def _matmul(self, op, plan: _OpPlan, label: str) -> None:
        x, y, out = plan.inputs["x"], plan.inputs["y"], plan.outputs[0]
        if len(x.shape) < 2 or len(y.shape) < 2:
            self._unsupported(op, "a matmul with a 1-D operand")
        for operand in (x, y, out):
            rank = len(operand.shape)
            self._keep_apart(operand, [rank - 2, rank - 1], f"{label} multiplies its last two dims")
        batch = len(out.shape) - 2
        if batch:
            self._broadcast(_batch(out, batch), [_batch(x, len(x.shape) - 2), _batch(y, len(y.shape) - 2)], label,
                            whole=False)  # (the batch dims only: a constant is not stored broadcast)

    def _gather(self, op, plan: _OpPlan, label: str) -> None:
        x, indices, out = plan.inputs["x"], plan.inputs.get("indices"), plan.outputs[0]
        if _value(op, "batch_dims", 0):
            self._unsupported(op, "a gather with batch_dims")
        rank = len(x.shape)
        axis = _axis(_value(op, "axis", 0), rank)
        q = len(indices.shape) if indices is not None else 0
        self._keep_apart(x, [axis], f"{label} gathers along axis {axis}")
        for k in range(rank - 1):
            if k + 1 < axis:
                self.cuts.tie(x.slots[k], out.slots[k])
            elif k > axis:
                self.cuts.tie(x.slots[k], out.slots[k + q - 1])
        for j in range(q - 1):
            self.cuts.tie(indices.slots[j], out.slots[axis + j])
        for boundary in (axis - 1, axis + q - 1):
            if 0 <= boundary < len(out.slots):
                self.cuts.force(out.slots[boundary], f"{label} puts its indices' dims here")

    # -- the rewrite -------------------------------------------------------------------------
    def _rewrite(self) -> None:
        folded: dict[int, object] = {}  # id(high-rank var) -> its folded replacement
        removed = []
        for plan in self.plans:
            op = plan.op
            new_inputs = {}
            for name, operand in plan.inputs.items():
                if isinstance(operand, list):
                    new_inputs[name] = [self._folded_input(o, folded, op) if isinstance(o, _Operand) else o
                                        for o in operand]
                else:
                    new_inputs[name] = self._folded_input(operand, folded, op)
            results = self._rebuild(plan, new_inputs, folded)
            for operand, result in zip(plan.outputs, results):
                if self.high(operand.var):
                    folded[id(operand.var)] = result
                else:
                    if list(result.shape) != list(operand.shape):
                        result = _reshape(result, list(operand.shape), op)
                    self.block.replace_uses_of_var_after_op(anchor_op=op, old_var=operand.var, new_var=result)
                    folded[id(operand.var)] = result  # (later plans read the value under its old Var)
            removed.append(op)
        self.block.remove_ops(removed)
        stale = [op for op in self.block.operations if op.op_type == "const" and self.high_const(op.outputs[0])
                 and not op.outputs[0].child_ops and op.outputs[0] not in self.block.outputs]
        if stale:
            self.block.remove_ops(stale)

    @staticmethod
    def high_const(var) -> bool:
        return _is_tensor(var) and var.rank > MAX_RANK

    def _folded_input(self, operand: _Operand, folded: dict, op):
        var = folded.get(id(operand.var), operand.var)
        if self.high(operand.var):
            return var
        shape = operand.folded_shape(self.cuts)
        if operand.broadcast:
            return mb.const(val=np.reshape(np.broadcast_to(var.val, operand.shape), shape), before_op=op)
        if shape == list(operand.shape):
            return var
        if var.val is not None and _is_const(var):
            return mb.const(val=np.reshape(var.val, shape), before_op=op)
        return _reshape(var, shape, op)

    def _out_shape(self, operand: _Operand) -> list[int]:
        return operand.folded_shape(self.cuts) if self.high(operand.var) else list(operand.shape)

    def _rebuild(self, plan: _OpPlan, inputs: dict, folded: dict) -> list:
        op, kind = plan.op, plan.op.op_type
        out = plan.outputs[0]
        if kind in RESHAPES:
            return [_reshape(inputs["x"], self._out_shape(out), op)]
        if kind == "transpose":
            return [_transposed(inputs["x"], plan.inputs["x"].shape, [int(p) for p in _value(op, "perm")],
                                self._out_shape(out), op)]
        if kind == "shape":
            return [mb.const(val=np.array(plan.inputs["x"].shape, dtype=np.int32), before_op=op)]
        params = _params(op, inputs)
        x = plan.inputs.get("x")
        if kind in ELEMENTWISE:
            pass
        elif kind in AXIS_OPS:
            params["axis"] = out.group_of(self.cuts, _axis(_value(op, "axis"), len(out.shape)))
            if kind == "split":
                base = plan.inputs["x"]
                params["axis"] = base.group_of(self.cuts, _axis(_value(op, "axis"), len(base.shape)))
        elif kind in REDUCTIONS:
            if kind in ("reduce_argmax", "reduce_argmin"):
                params["axis"] = x.group_of(self.cuts, _axis(_value(op, "axis", -1), len(x.shape)))
            else:
                axes = _axes(_value(op, "axes"), len(x.shape))
                params["axes"] = sorted({x.group_of(self.cuts, a) for a in axes})
        elif kind == "layer_norm":
            axes = _axes(_value(op, "axes"), len(x.shape))
            groups = sorted({x.group_of(self.cuts, a) for a in axes})
            params["axes"] = groups
            shape = [x.folded_shape(self.cuts)[g] for g in groups]
            for name in ("gamma", "beta"):
                if params.get(name) is not None:
                    params[name] = np.reshape(op.inputs[name].val, shape)
        elif kind == "gather":
            params["axis"] = x.group_of(self.cuts, _axis(_value(op, "axis", 0), len(x.shape)))
        elif kind == "stack":
            params["axis"] = out.group_of(self.cuts, _axis(_value(op, "axis"), len(out.shape)))
        elif kind in ("slice_by_index", "slice_by_size"):
            params.update(_folded_slice(op, x, self.cuts))
        elif kind == "pad":
            pads = [int(p) for p in _value(op, "pad")]
            padded = len(pads) // 2
            rank, folded = len(x.shape), []
            for group in x.groups(self.cuts):
                i = group[0] - (rank - padded)
                folded += pads[2 * i:2 * i + 2] if len(group) == 1 and i >= 0 else [0, 0]
            params["pad"] = np.array(folded, np.int32)
        elif kind == "tile":
            reps = [int(r) for r in _value(op, "reps")]
            params["reps"] = [math.prod(reps[d] for d in group) for group in x.groups(self.cuts)]
        result = getattr(mb, kind)(**params, before_op=op)
        return list(result) if isinstance(result, (list, tuple)) else [result]


# -- helpers ---------------------------------------------------------------------------------
def _is_tensor(var) -> bool:
    if not isinstance(var, Var) or isinstance(var, ListVar):  # (a ListVar's shape raises)
        return False
    try:
        return var.shape is not None
    except ValueError:
        return False


def _is_const(var) -> bool:
    return var.op is not None and var.op.op_type == "const"


def _all_ops(block):
    for op in list(block.operations):
        yield op
        for inner in op.blocks:
            yield from _all_ops(inner)


def _input_vars(op):
    for value in op.inputs.values():
        for var in value if isinstance(value, (list, tuple)) else (value,):
            if _is_tensor(var):
                yield var


def _producer(var):
    """The op that computes ``var``, looking through the identities that name model outputs."""
    op = var.op
    while op is not None and op.op_type == "identity" and op.x.op is not None:
        op = op.x.op
    return op


def _flat(values):
    for value in values:
        if isinstance(value, list):
            yield from (v for v in value if isinstance(v, _Operand))
        elif isinstance(value, _Operand):
            yield value


def _value(op, name: str, default=None):
    var = op.inputs.get(name)
    if var is None:
        return default
    val = var.val
    if val is None:
        raise DeclinedForm(f"op {op.name!r} ({op.op_type}): its {name} is not known at build time")
    return val.tolist() if isinstance(val, np.ndarray) else val


def _axis(axis, rank: int) -> int:
    axis = int(axis)
    return axis + rank if axis < 0 else axis


def _axes(axes, rank: int) -> list[int]:
    if axes is None:
        return list(range(rank))
    axes = [axes] if isinstance(axes, (int, np.integer)) else axes
    return sorted(_axis(a, rank) for a in axes)


def _fill_ones(status: list[str]) -> list[str]:
    """Size-1 dims go with any neighbour: each takes the status of the dim before it (or after)."""
    filled = list(status)
    for k in range(len(filled)):
        if filled[k] == "one" and k > 0:
            filled[k] = filled[k - 1]
    for k in range(len(filled) - 2, -1, -1):
        if filled[k] == "one":
            filled[k] = filled[k + 1]
    return filled


def _batch(operand: _Operand, dims: int) -> _Operand:
    return _Operand(operand.var, operand.shape[:dims], operand.slots[:max(dims - 1, 0)])


def _params(op, inputs: dict) -> dict:
    """The op's inputs as builder arguments: folded tensors, and every other input by value."""
    params = {}
    for name, var in op.inputs.items():
        if name in inputs:
            params[name] = inputs[name]
        elif isinstance(var, (list, tuple)):
            params[name] = var
        elif var.val is not None:
            params[name] = var.val
        else:
            params[name] = var
    return params


def _sliced_axes(op, shape) -> list[int]:
    rank = len(shape)
    sliced = []
    if op.op_type == "slice_by_size":
        begin, size = _value(op, "begin"), _value(op, "size")
        for k in range(rank):
            if begin[k] != 0 or (size[k] != -1 and size[k] != shape[k]):
                sliced.append(k)
        return sliced
    begin, end = _value(op, "begin"), _value(op, "end")
    stride = _value(op, "stride") or [1] * rank
    begin_mask = _value(op, "begin_mask") or [False] * rank
    end_mask = _value(op, "end_mask") or [False] * rank
    for k in range(rank):
        starts = begin_mask[k] or begin[k] == 0 or begin[k] <= -shape[k]
        ends = end_mask[k] or end[k] >= shape[k]
        if not (starts and ends and stride[k] == 1):
            sliced.append(k)
    return sliced


def _folded_slice(op, x: _Operand, cuts: _Cuts) -> dict:
    groups, shape = x.groups(cuts), x.folded_shape(cuts)
    sliced = set(_sliced_axes(op, x.shape))
    if op.op_type == "slice_by_size":
        begin, size = _value(op, "begin"), _value(op, "size")
        return {"begin": [begin[g[0]] if g[0] in sliced else 0 for g in groups],
                "size": [size[g[0]] if g[0] in sliced else shape[i] for i, g in enumerate(groups)]}
    rank = len(x.shape)
    begin, end = _value(op, "begin"), _value(op, "end")
    stride = _value(op, "stride") or [1] * rank
    begin_mask = _value(op, "begin_mask") or [False] * rank
    end_mask = _value(op, "end_mask") or [False] * rank
    one = [g[0] in sliced for g in groups]
    return {
        "begin": [begin[g[0]] if s else 0 for g, s in zip(groups, one)],
        "end": [end[g[0]] if s else shape[i] for i, (g, s) in enumerate(zip(groups, one))],
        "stride": [stride[g[0]] if s else 1 for g, s in zip(groups, one)],
        "begin_mask": [bool(begin_mask[g[0]]) if s else True for g, s in zip(groups, one)],
        "end_mask": [bool(end_mask[g[0]]) if s else True for g, s in zip(groups, one)],
        "squeeze_mask": [False] * len(groups),
    }


def transpose_steps(shape, perm) -> list[tuple[list[int], list[int]]]:
    """(reshape target, permutation) steps, each of rank <= 5, that move a tensor of ``shape`` as
    ``transpose(perm)`` does (in row-major layout; a final reshape gives the result its shape).

    Size-1 dims are dropped and runs of dims the permutation keeps adjacent are merged first; when
    more than five runs remain, each step brings one run to the front with a rank-4 transpose."""
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    order = [d for d in perm if shape[d] != 1]  # the kept dims in output order
    runs: list[list[int]] = []
    for d in order:
        if runs and keep.index(d) == keep.index(runs[-1][-1]) + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    by_position = sorted(runs, key=lambda run: run[0])
    sizes = [math.prod(shape[d] for d in run) for run in by_position]
    run_perm = [by_position.index(run) for run in runs]
    if run_perm == sorted(run_perm):
        return []  # a reshape moves it already
    if len(runs) <= MAX_RANK:
        return [(sizes, run_perm)]
    steps, leading, placed = [], 1, set()
    for axis in run_perm:
        placed.add(axis)
        before = math.prod(s for i, s in enumerate(sizes[:axis]) if i not in placed)
        after = math.prod(s for i, s in enumerate(sizes[axis + 1:], start=axis + 1) if i not in placed)
        if before != 1:
            steps.append(([leading, before, sizes[axis], after], [0, 2, 1, 3]))
        leading *= sizes[axis]
    return steps


def _transposed(x, shape, perm, out_shape, op):
    for target, step in transpose_steps(shape, perm):
        x = _reshape(x, target, op)
        x = mb.transpose(x=x, perm=step, before_op=op)
    return _reshape(x, out_shape, op)


def _reshape(x, shape, op):
    """``x`` reshaped to ``shape`` before ``op``: a reshape of a reshape reads the first one's input
    (coremltools' curated passes merge no reshapes), and none is made where the shape is ``x``'s."""
    while (x.op is not None and x.op.op_type == "reshape" and _is_tensor(x.op.x) and x.op.x.rank <= MAX_RANK
           and not any_symbolic(x.op.x.shape)):
        x = x.op.x
    if list(x.shape) == list(shape):
        return x
    return mb.reshape(x=x, shape=list(shape), before_op=op)


def legalise_ranks(function, where=None) -> int:
    """Fold the dims of ``function``'s values of rank > 5 (see the module); the number folded.
    ``where(op)`` names an op in errors (the converter names the ONNX node it came from)."""
    return RankLegaliser(function, where).run()


def onnx_node_namer(graph):
    """``where(op)`` for errors: the ONNX node of ``graph`` a MIL op was lowered from (the lowering
    names its ops after the node), else the MIL op itself."""
    import re

    def where(op) -> str:
        best = None
        for node in graph:
            base = node.name or (node.outputs[0].name if node.outputs else node.op_type)
            ident = re.sub(r"[^A-Za-z0-9_]", "_", base)
            ident = f"op_{ident}" if ident[:1].isdigit() else ident
            if ident and op.name.startswith(ident) and (best is None or len(ident) > len(best[0])):
                best = (ident, node)
        if best is None:
            return f"MIL op {op.name!r} ({op.op_type})"
        node = best[1]
        domain = f"{node.domain}::" if node.domain else ""
        return f"node {node.name or '<unnamed>'!r} ({domain}{node.op_type})"

    return where
