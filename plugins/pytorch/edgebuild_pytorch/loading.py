"""Loads a PyTorch source into an eager ``torch.nn.Module``: TorchScript, ExportedProgram, or a
module built by a factory with its weights (state_dict ``.pt`` or ``.safetensors``).

Weights are read with ``torch.load(weights_only=True)`` or safetensors, so loading a state_dict
never runs pickled code; TorchScript and ExportedProgram archives hold no pickled Python either.
"""

from __future__ import annotations

import contextlib
import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgebuild.plugin import BuildError, UsageError, resolve_factory

from edgebuild_pytorch.options import PyTorchOptions
from edgebuild_pytorch.sources import resolve_config

MAX_KEYS_SHOWN = 5


def require_torch():
    try:
        import torch
    except ImportError:
        raise BuildError(
            "source.format pytorch needs torch, which is not installed",
            hint="install the CPU build: pip install 'edgebuild-pytorch[torch]' (torch==2.13.0)",
        ) from None
    return torch


def source_kind(path: Path, options: PyTorchOptions) -> str:
    """The recipe's ``kind``, else one inferred from the file suffix and whether a factory is given."""
    if options.kind:
        return options.kind
    suffix = path.suffix.lower()
    if suffix == ".pt2":
        return "exported_program"
    if suffix == ".safetensors" or options.factory:
        return "state_dict"
    return "torchscript"


@dataclass
class LoadedSource:
    """An eager module plus what is needed to get a fresh copy of it (TorchScript may keep state)."""

    kind: str
    module: Any
    fresh: Callable[[], Any]
    details: dict
    positional: list[str] | None = None  # argument order, for modules that take no keywords


def load_source(path: Path, options: PyTorchOptions, base_dir: Path | None = None) -> LoadedSource:
    path = Path(path)
    kind = source_kind(path, options)
    if kind == "torchscript":
        return _load_torchscript(path, options)
    if kind == "exported_program":
        return _load_exported_program(path)
    if kind == "causal_lm":
        return _load_causal_lm(path, options, base_dir)
    return _load_state_dict(path, options, base_dir)


def _load_torchscript(path: Path, options: PyTorchOptions) -> LoadedSource:
    torch = require_torch()
    blob = path.read_bytes()

    def fresh():
        return torch.jit.load(io.BytesIO(blob), map_location="cpu").eval()

    try:
        module = fresh()
    except Exception as exc:
        raise BuildError(
            f"{path.name}: not a TorchScript archive ({type(exc).__name__}: {_first_line(exc)})",
            hint="for a state_dict give source.options.factory; for torch.export programs use a .pt2 file "
            "or source.options.kind: exported_program",
        ) from exc
    return LoadedSource("torchscript", module, fresh, {})


def _load_exported_program(path: Path) -> LoadedSource:
    torch = require_torch()
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise BuildError(
            f"{path.name}: not a torch.export program ({type(exc).__name__}: {_first_line(exc)})",
            hint="save it with torch.export.save(program, 'model.pt2')",
        ) from exc
    module = program.module()
    # An exported program checks its call against the spec it was exported with: positional.
    order = [spec.arg.name for spec in program.graph_signature.input_specs
             if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    return LoadedSource("exported_program", module, lambda: module, {}, positional=order)


def _load_state_dict(path: Path, options: PyTorchOptions, base_dir: Path | None) -> LoadedSource:
    if not options.factory:
        raise UsageError(
            f"{path.name}: a state_dict needs the module it belongs to",
            hint="set source.options.factory: 'package.module:callable' (plus factory_kwargs)",
        )
    details: dict = {"factory": options.factory}
    kwargs = dict(options.factory_kwargs)
    if options.config:
        config = resolve_config(options.config, options.config_sha256, weights=path, base_dir=base_dir)
        kwargs["config"] = str(config)
        details["config"] = str(config.name)

    # Read once: safetensors and torch.load(mmap=True) map the file, and every fresh module is
    # built with its parameters on the meta device and then given these tensors, so a copy costs
    # no weight memory (a billion-parameter model is never initialised at random, nor copied).
    state = read_state_dict(path)

    def fresh():
        with parameters_on_meta():
            module = build_module(options.factory, kwargs)
        load_weights_into(module, state, path.name, options.factory)
        return module.eval()

    return LoadedSource("state_dict", fresh(), fresh, details)


def _load_causal_lm(path: Path, options: PyTorchOptions, base_dir: Path | None) -> LoadedSource:
    """A transformers causal LM: the state_dict route with a default factory and config.json."""
    from edgebuild_pytorch.causal_lm import DEFAULT_CONFIG, DEFAULT_FACTORY

    update = {"factory": options.factory or DEFAULT_FACTORY, "config": options.config or DEFAULT_CONFIG}
    loaded = _load_state_dict(path, options.model_copy(update=update), base_dir)
    loaded.kind = "causal_lm"
    return loaded


def build_module(spec: str, kwargs: dict):
    """Call the factory; any failure names it, since the traceback alone would point into user code."""
    torch = require_torch()
    factory = resolve_factory(spec)
    try:
        module = factory(**kwargs)
    except Exception as exc:
        raise BuildError(
            f"source.options.factory {spec!r} raised {type(exc).__name__}: {_first_line(exc)}",
            hint="check factory_kwargs and that the factory builds the module without downloading anything",
        ) from exc
    if not isinstance(module, torch.nn.Module):
        raise BuildError(
            f"source.options.factory {spec!r} returned {type(module).__name__}, not a torch.nn.Module"
        )
    return module


def read_state_dict(path: Path) -> dict:
    torch = require_torch()
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = _torch_load(path)
    except ImportError:
        raise BuildError(f"{path.name}: reading .safetensors needs the safetensors package: pip install safetensors") from None
    except Exception as exc:
        raise BuildError(
            f"{path.name}: not a readable state_dict ({type(exc).__name__}: {_first_line(exc)})",
            hint="state_dicts are read with torch.load(weights_only=True): save tensors only, not whole modules",
        ) from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # training checkpoints wrap the weights
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BuildError(f"{path.name}: expected a mapping of parameter names to tensors")
    return state


def _torch_load(path: Path):
    """``torch.load`` mapping the file when its format allows (the zip format does; legacy files not)."""
    torch = require_torch()
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        return torch.load(str(path), map_location="cpu", weights_only=True)


_ON_META = threading.local()  # set in the thread building a module inside parameters_on_meta()
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = [0, None]  # threads inside parameters_on_meta(), torch's own register_parameter


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside, in this thread, get their parameters on the meta device (no memory,
    no random init); buffers stay real, since a module computes the non-persistent ones (rotary
    frequencies) itself and a state_dict does not hold them. ``load_weights_into`` assigns the
    real parameters. Other threads building modules meanwhile are not affected."""
    torch = require_torch()
    with _PATCH_LOCK:
        if _PATCH_USERS[0] == 0:
            register = _PATCH_USERS[1] = torch.nn.Module.register_parameter

            def register_on_meta(module, name, param):
                lazy = isinstance(param, torch.nn.parameter.UninitializedParameter)
                if getattr(_ON_META, "on", False) and param is not None and not lazy and param.device.type != "meta":
                    param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
                register(module, name, param)

            torch.nn.Module.register_parameter = register_on_meta
        _PATCH_USERS[0] += 1
    _ON_META.on = True
    try:
        yield
    finally:
        _ON_META.on = False
        with _PATCH_LOCK:
            _PATCH_USERS[0] -= 1
            if _PATCH_USERS[0] == 0:
                torch.nn.Module.register_parameter = _PATCH_USERS[1]


def state_dict_mismatch(module_state: dict, loaded: dict) -> list[str]:
    """Human-readable differences between the module's parameters and the file's, first few of each kind."""
    expected, given = list(module_state), list(loaded)
    missing = [k for k in expected if k not in loaded]
    unexpected = [k for k in given if k not in module_state]
    wrong_shape = [
        f"{k} (module {list(module_state[k].shape)}, file {list(loaded[k].shape)})"
        for k in expected if k in loaded and tuple(module_state[k].shape) != tuple(loaded[k].shape)
    ]
    problems = []
    for label, keys in (("missing from the file", missing), ("not in the module", unexpected),
                        ("with other shapes", wrong_shape)):
        if keys:
            shown = ", ".join(keys[:MAX_KEYS_SHOWN]) + (f" (+{len(keys) - MAX_KEYS_SHOWN} more)" if len(keys) > MAX_KEYS_SHOWN else "")
            problems.append(f"{len(keys)} key(s) {label}: {shown}")
    return problems


def load_weights_into(module, state: dict, file_name: str, factory: str) -> None:
    # keep_vars: the module's own Parameter objects, so ties are found by identity even on the meta device
    module_state = module.state_dict(keep_vars=True)
    # Older checkpoints saved buffers the module now keeps non-persistent (e.g. BERT's
    # position_ids): the module computes those itself, so the file's copy is not needed.
    transient = {name for name, _ in module.named_buffers()} - set(module_state)
    state = {k: v for k, v in state.items() if k not in transient}
    # A tied parameter (a language model's output projection sharing the embedding) is saved once.
    ties = _ties_to_saved(module_state, state)
    expected = {k: v for k, v in module_state.items() if k not in ties}
    problems = state_dict_mismatch(expected, state)
    if problems:
        raise BuildError(
            f"{file_name} does not match the module from {factory!r}:\n  " + "\n  ".join(problems),
            hint="check that the factory builds the architecture these weights were saved from",
        )
    # assign: the module takes the file's tensors themselves (its own may be on the meta device)
    module.load_state_dict(state, strict=not ties, assign=True)
    # assign replaced the saved side of each tie; point the other side at it again
    for key, saved in ties.items():
        _set_tensor(module, key, _get_tensor(module, saved))
    left = [name for name, tensor in [*module.named_parameters(), *module.named_buffers()] if tensor.is_meta]
    if left:
        raise BuildError(
            f"{file_name}: the module from {factory!r} keeps {len(left)} tensor(s) the file does not set, "
            f"e.g. {', '.join(left[:MAX_KEYS_SHOWN])}",
            hint="the factory must create its buffers from real values; parameters come from the file",
        )


def _ties_to_saved(module_state: dict, saved: dict) -> dict[str, str]:
    """``{key the file lacks: saved key sharing its tensor}`` — the same Parameter object (the
    only tie a meta tensor can show) or, for real tensors, the same storage."""
    ties = {}
    for key, tensor in module_state.items():
        if key in saved:
            continue
        for other, candidate in module_state.items():
            if other == key or other not in saved:
                continue
            same_storage = (not tensor.is_meta and not candidate.is_meta
                            and tensor.data_ptr() != 0 and tensor.data_ptr() == candidate.data_ptr())
            if candidate is tensor or same_storage:
                ties[key] = other
                break
    return ties


def _get_tensor(module, key: str):
    owner, _, name = key.rpartition(".")
    return getattr(module.get_submodule(owner), name)


def _set_tensor(module, key: str, tensor) -> None:
    owner, _, name = key.rpartition(".")
    setattr(module.get_submodule(owner), name, tensor)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
