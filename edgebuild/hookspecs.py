"""Every hook edgebuild calls, documented where it is declared.

Hooks follow the register-callback style: edgebuild calls ``edgebuild_register_X(register)``
once per plugin and the plugin calls ``register(...)`` for each thing it provides. A name
registered by two plugins is an error naming both, so a plugin cannot silently shadow
another. What the core calls on each registered object is the protocol the hook names, in
:mod:`edgebuild.protocols`; subclass it. Implement a hook with ``@edgebuild.hookimpl`` in the
module named by your distribution's ``edgebuild`` entry point::

    [project.entry-points.edgebuild]
    my_ops = "my_ops.plugin"
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("edgebuild")
hookimpl = pluggy.HookimplMarker("edgebuild")


@hookspec
def edgebuild_register_resolvers(register):
    """Register source resolvers: ``register(scheme, resolver)``.

    ``scheme`` is the URI prefix before ``:`` (``"file"`` for plain paths, ``"pypi"``,
    ``"https"``). ``resolver`` follows :class:`edgebuild.protocols.Resolver`.
    """


@hookspec
def edgebuild_register_frontends(register):
    """Register model frontends: ``register(format, frontend)``.

    ``format`` is the name a recipe gives as ``source.format`` (``"onnx"``, ``"pytorch"``, or
    any other a plugin registers; ``.onnx`` and the PyTorch suffixes imply the first two).
    ``frontend`` follows :class:`edgebuild.protocols.Frontend`; a frontend that registers
    ``"<format>:source.options"`` (see ``edgebuild_register_recipe_sections``) is given that
    section's model, validated at load, as ``options``.
    """


@hookspec
def edgebuild_register_passes(register):
    """Register graph passes: ``register(name, graph_pass)``.

    ``graph_pass`` follows :class:`edgebuild.protocols.GraphPass`; ``name`` is what the recipe's
    ``optimize.passes`` turns on or off. Fusion passes are usually onnxscript rewrite rules.
    """


@hookspec
def edgebuild_register_lowerings(register):
    """Register op lowerings: ``register(backend, op_type, fn, domain="", since=1, until=None)``.

    ``fn`` lowers one ONNX node of ``op_type`` in ``domain`` for model opsets in
    ``[since, until]`` to the backend's ops. Its signature is the backend's to define
    (Core ML: ``fn(ctx, node) -> Var | tuple``). Registering the same (backend, domain,
    op_type, opset range) twice is an error; overlapping ranges are too.
    """


@hookspec
def edgebuild_register_backends(register):
    """Register backends: ``register(name, backend)``.

    ``name`` is the recipe's ``target.backend``; ``backend`` follows
    :class:`edgebuild.protocols.Backend`: it returns the stages after ``optimize`` (lower,
    compress, package, validate), checks what only it can judge in a recipe, and may predict a
    compute plan and run conformance cases.
    """


@hookspec
def edgebuild_register_runtimes(register):
    """Register runtimes that execute artifacts: ``register(name, runtime)``.

    ``runtime`` follows :class:`edgebuild.protocols.Runtime`. The MIL interpreter is one; Core ML
    on macOS (``native = True``) another.
    """


@hookspec
def edgebuild_register_recipe_sections(register):
    """Register plugin-owned recipe sections: ``register(name, model)``.

    ``name`` is ``"<owner>:<dotted path>"`` (``"coreml:compression"``, ``"pytorch:source.options"``)
    and ``model`` a pydantic model that validates it, a subclass of
    :class:`edgebuild.protocols.RecipeSection`: its ``check_recipe(recipe)`` raises ``RecipeError``
    for what depends on the rest of the recipe (a compression mode the deployment target lacks).
    Errors carry the recipe's file:line. Sections are validated once, at load: stages read the
    model instance as ``variant.section(name)`` and its JSON, defaults applied, for cache keys
    from ``variant.params``.
    """


@hookspec
def edgebuild_register_custom_ops(register):
    """Register custom ops: ``register(domain, op_type, spec)``.

    ``spec`` follows :class:`edgebuild.protocols.CustomOp`: the op's inputs, outputs and numpy
    reference (``run_reference``), and whatever else its plugins read (an MSL kernel's source).
    Validation needs the reference: onnxruntime cannot run a source model that uses the op, so
    such a model is evaluated by onnx's ``ReferenceEvaluator`` with every registered op's
    reference, and a model whose op has a lowering but no reference here fails to validate,
    naming the op (``validate.reference: none`` builds it unvalidated). A plugin that lowers an
    op and ships no kernel registers ``edgebuild.plugin.OpReference(domain, op_type,
    reference=fn, inputs=(...), outputs=(...), attributes={name: default})``.
    """


@hookspec
def edgebuild_register_conformance_suites(register):
    """Register conformance suites: ``register(name, collect)``; ``edgebuild conformance --suite NAME``.

    ``collect(ops)`` returns the suite's cases as ``edgebuild.plugin.ConformanceCase`` objects, only
    those of ``ops`` when given (names as the suite spells them). A case is an ONNX model with its
    inputs and the outputs its source's own semantics give (a StableHLO frontend: JAX's), so the
    backend's conformance runner judges it as it judges the ONNX node cases; a case the frontend
    cannot convert carries the reason in ``reason`` and is reported unsupported, not run.
    """


@hookspec
def edgebuild_register_commands(register):
    """Register commands of the ``edgebuild`` CLI: ``register(name, factory)``.

    ``edgebuild NAME ...`` runs the command. ``factory()`` returns a ``typer.Typer`` (a command
    group: its commands become ``edgebuild NAME COMMAND``) or a function typer turns into one
    command (its parameters are the options, its docstring the help). The CLI calls the
    factories when it lists its commands (``edgebuild --help``) or meets a name none of its own
    commands has, never for its own commands: import what the command needs inside it, not in
    the module the factory comes from, so ``edgebuild --help`` stays fast. A name that one of
    edgebuild's own commands or another plugin's holds is an error naming both.
    """
