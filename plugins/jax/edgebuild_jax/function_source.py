"""A JAX function and its parameters -> a ``jax.export`` for the recipe's input shapes.

``source.options.factory: 'package.module:callable'`` returns ``(apply, params)``: ``apply(params,
*inputs)`` is the model, ``params`` a pytree of arrays (its structure and dtypes; the values come
from ``source.model``). The weights file is Flax's ``.msgpack`` (``flax.serialization.to_bytes``), or
a ``.safetensors`` / ``.npz`` whose keys are the parameters' pytree paths joined by ``/``
(``params/Dense_0/kernel``). The parameters are exported as arguments, not constants, so the
module stays small and the weights become initializers of the IR, read once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgebuild.plugin import BuildError, UsageError, resolve_factory

WEIGHT_SUFFIXES = (".msgpack", ".safetensors", ".npz")


def build(spec: str, kwargs: dict):
    """``(apply, params template)`` from the factory, checked."""
    try:
        made = resolve_factory(spec)(**kwargs)
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError(f"source.options.factory {spec!r} failed: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise BuildError(f"source.options.factory {spec!r} must return (apply, params), apply(params, *inputs) "
                         f"being the model; it returned {type(made).__name__}")
    return made


def load_params(path: Path, template):
    """The parameters in ``path``, in the structure and dtypes of ``template``; a missing,
    unexpected or mis-shaped entry is named."""
    import jax

    suffix = path.suffix.lower()
    if suffix == ".msgpack":
        from flax import serialization

        try:
            return serialization.from_bytes(template, path.read_bytes())
        except Exception as exc:
            raise BuildError(f"{path.name}: the weights do not fit the factory's parameters: {exc}") from exc
    if suffix == ".safetensors":
        from safetensors.numpy import load_file

        flat = load_file(str(path))
    elif suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            flat = {key: archive[key] for key in archive.files}
    else:
        raise UsageError(f"source.model: {path.name}: weights of a JAX function are {', '.join(WEIGHT_SUFFIXES)}")
    leaves, tree = jax.tree_util.tree_flatten_with_path(template)
    keys = [path_key(key_path) for key_path, _ in leaves]
    missing = [k for k in keys if k not in flat]
    unexpected = sorted(set(flat) - set(keys))
    if missing or unexpected:
        raise BuildError(f"{path.name}: the weights do not fit the factory's parameters: missing "
                         f"{missing[:3] or 'none'}, unexpected {unexpected[:3] or 'none'}",
                         hint="keys are pytree paths joined by '/', e.g. params/Dense_0/kernel")
    values = []
    for key, (_, like) in zip(keys, leaves):
        value = flat[key]
        if tuple(value.shape) != tuple(np.shape(like)):
            raise BuildError(f"{path.name}: {key} has shape {list(value.shape)}, the model expects "
                             f"{list(np.shape(like))}")
        values.append(value.astype(np.asarray(like).dtype, copy=False))
    return jax.tree_util.tree_unflatten(tree, values)


def path_key(key_path) -> str:
    import jax

    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in key_path) \
        if key_path else jax.tree_util.keystr(key_path)


def export_function(path: Path, options, inputs: dict[str, dict]):
    """``(Exported, {flat argument position: parameter array}, input names)`` for the recipe's inputs."""
    import jax
    from jax import export as jax_export

    from edgebuild_jax.symbolic_dims import export_specs

    apply, template = build(options.factory, dict(options.factory_kwargs))
    params = load_params(path, template)
    names, specs = export_specs(inputs)  # a range or enumeration: a symbolic dim
    param_specs = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype), params)
    try:
        exported = jax_export.export(jax.jit(apply))(param_specs, *specs)
    except Exception as exc:
        raise BuildError(f"source.options.factory {options.factory!r}: jax.export failed for the recipe's input "
                         f"shapes: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(params)]
    kept = list(exported.module_kept_var_idx)
    bound = {position: leaves[index] for position, index in enumerate(kept) if index < len(leaves)}
    free_names = [names[index - len(leaves)] for index in kept if index >= len(leaves)]
    return exported, params, bound, free_names
