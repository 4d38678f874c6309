"""Every hook edgebuild calls, documented where it is declared.

Hooks follow the register-callback style: edgebuild calls ``edgebuild_register_X(register)``
once per plugin and the plugin calls ``register(...)`` for each thing it provides. A name
registered by two plugins is an error naming both, so a plugin cannot silently shadow
another. Implement a hook with ``@edgebuild.hookimpl`` in the module named by your
distribution's ``edgebuild`` entry point::

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
    ``"https"``). ``resolver(uri, *, sha256, workdir)`` returns the local path of the
    model file; it must verify ``sha256`` when given and never execute what it fetched.
    """


@hookspec
def edgebuild_register_frontends(register):
    """Register model frontends: ``register(format, frontend)``.

    ``format`` is the name a recipe gives as ``source.format`` (``"onnx"``, ``"pytorch"``, or
    any other a plugin registers; ``.onnx`` and the PyTorch suffixes imply the first two).
    ``frontend.import_model(path, inputs, out_dir)`` writes ``out_dir/model.onnx`` (weights
    as external data beside it) and returns a dict for the report; a frontend that registers
    ``"<format>:source.options"`` (see ``edgebuild_register_recipe_sections``) is also given
    ``options=`` (that model, validated at load) and ``base_dir=``. A frontend whose options
    name local files (a config) lists them with the optional
    ``frontend.option_files(options, source_path_or_None, base_dir) -> list[Path]``; their
    digests join the import stage's cache key and they become build prerequisites.
    """


@hookspec
def edgebuild_register_passes(register):
    """Register graph passes: ``register(name, graph_pass)``.

    A pass has ``default: bool`` (on unless the recipe's ``optimize.passes`` says otherwise)
    and ``apply(model: onnx_ir.Model) -> int``, returning how many times it rewrote the
    graph. Fusion passes are usually onnxscript rewrite rules; build the rule objects in
    ``apply``, not once per process: a matcher keeps the last graph it matched, and with it
    that model's weights.
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

    A backend turns an optimised ONNX model into an artifact: ``backend.lower``,
    ``backend.compress`` and ``backend.package`` are the bodies of the lower, compress and
    package stages (see :mod:`edgebuild.dag.stages`).
    """


@hookspec
def edgebuild_register_compressors(register):
    """Register weight compressors: ``register(backend, mode, compressor)``.

    ``mode`` is the recipe's ``compression.weights.mode`` (``"palettize"``, ``"linear"``,
    ``"prune"``, ...).
    """


@hookspec
def edgebuild_register_runtimes(register):
    """Register runtimes that execute artifacts: ``register(name, runtime)``.

    ``runtime.can_run(artifact_path) -> bool`` and ``runtime.run(artifact_path, inputs)``
    returning a dict of numpy arrays. The MIL interpreter is one; Core ML on macOS another.
    """


@hookspec
def edgebuild_register_recipe_sections(register):
    """Register plugin-owned recipe sections: ``register(name, model)``.

    ``name`` is ``"<owner>:<dotted path>"`` (``"coreml:compression"``, ``"pytorch:source.options"``)
    and ``model`` a pydantic model that validates it. A validated section may also define
    ``check_recipe(recipe)``, raising ``RecipeError`` for what depends on the rest of the recipe
    (a compression mode the deployment target lacks). Errors carry the recipe's file:line.
    Sections are validated once, at load: stages read the model instance as
    ``variant.section(name)`` and its JSON, defaults applied, for cache keys from ``variant.params``.
    """


@hookspec
def edgebuild_register_custom_ops(register):
    """Register custom ops: ``register(domain, op_type, spec)``.

    ``spec`` carries the op's ONNX schema, a numpy reference and the kernels that
    implement it (an MSL source, a Core ML decomposition).
    """
