"""Calls and control flow: ``func.call`` (inlined), ``composite`` (its decomposition inlined),
``custom_call`` (refused with its target)."""

from __future__ import annotations

from edgebuild_jax.convert.registry import converts


def _symbol(attr) -> str:
    return str(attr).lstrip("@").strip('"')


def inline_function(cx, name: str, arguments, op):
    function = cx.functions.get(name)
    if function is None:
        raise cx.error(op, f"calls {name}, which the module does not define")
    return cx.convert_block(function.regions[0].blocks[0], arguments)


@converts("func.call")
def call(op, cx):
    return inline_function(cx, _symbol(op.attributes["callee"]), cx.inputs(op), op)


@converts("stablehlo.composite")
def composite(op, cx):
    return inline_function(cx, _symbol(op.attributes["decomposition"]), cx.inputs(op), op)


@converts("stablehlo.custom_call")
def custom_call(op, cx):
    target = str(op.attributes["call_target_name"]).strip('"')
    raise cx.error(op, f"custom_call to {target!r} is not supported: its semantics live in a runtime library",
                   hint="export without the custom kernel (e.g. jax's default lowering on CPU), or register "
                        "a plugin lowering for it")
