"""What each first-party plugin distribution provides, known without importing it.

A recipe that names the ``bundle`` backend, or a command line that says ``edgebuild kernels``,
in an install without the plugin behind it gets an error naming the distribution to install
instead of a bare "not found". The plugins themselves stay the source of truth for what is
installed; this table only answers for what is not (a test with every plugin installed keeps
it equal to what they register).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Distribution:
    name: str  # as pip knows it
    folder: str  # its folder in a checkout of this repository
    extras: str = ""  # the extras a checkout install names, e.g. "torch"
    needs: tuple[str, ...] = ()  # other first-party distributions its provided things need to work
    backends: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    recipe_sections: tuple[str, ...] = ()  # "owner:dotted.path", as registered
    frontends: tuple[str, ...] = ()  # source formats

    def provides(self, kind: str, name: str) -> bool:
        return name in getattr(self, kind, ())


DISTRIBUTIONS = (
    Distribution("edgebuild-coreml", "plugins/coreml", backends=("coreml",), recipe_sections=("coreml:compression",)),
    # the bundle backend puts segments on Core ML and custom Metal kernels (its `bundle` extra)
    Distribution("edgebuild-mpsgraph", "plugins/mpsgraph", needs=("edgebuild-coreml", "edgebuild-msl"),
                 backends=("bundle",), recipe_sections=("bundle:target.options",)),
    Distribution("edgebuild-msl", "plugins/msl", commands=("kernels",)),
    Distribution("edgebuild-pytorch", "plugins/pytorch", extras="torch", frontends=("pytorch",),
                 recipe_sections=("pytorch:source.options",)),
    Distribution("edgebuild-jax", "plugins/jax", extras="jax", frontends=("stablehlo",),
                 recipe_sections=("stablehlo:source.options",)),
)

NAMES = frozenset(d.name for d in DISTRIBUTIONS)

# what each kind is called in a sentence
_WHAT = {"backends": "backend", "commands": "command", "recipe_sections": "recipe section",
         "frontends": "source format"}


def provider(kind: str, name: str) -> Distribution | None:
    """The first-party distribution that registers ``name`` of ``kind`` (a registry table name)."""
    return next((d for d in DISTRIBUTIONS if d.provides(kind, name)), None)


def install_command(*dists: Distribution, installed: set[str] | None = None) -> str:
    """The pip command that installs ``dists`` from a checkout, with the first-party
    distributions they need that ``installed`` (distribution names) lacks."""
    installed = installed if installed is not None else installed_distributions()
    wanted = {d.name for d in dists}
    needed = [d for d in DISTRIBUTIONS
              if d.name not in wanted and d.name not in installed and any(d.name in w.needs for w in dists)]
    folders = [f"./{d.folder}[{d.extras}]" if d.extras else f"./{d.folder}" for d in (*dists, *needed)]
    return "pip install " + " ".join(f"'{f}'" if "[" in f else f for f in folders)


def provided_by(kind: str, name: str, installed: set[str] | None = None) -> str | None:
    """``provided by edgebuild-mpsgraph; install it with ...``, or None when no first-party
    distribution provides ``name``."""
    dist = provider(kind, name)
    if dist is None:
        return None
    return f"provided by {dist.name}; install it with `{install_command(dist, installed=installed)}` (from a checkout)"


def missing_hint(kind: str, name: str, installed: set[str] | None = None) -> str | None:
    """``the `bundle` backend is provided by edgebuild-mpsgraph; install it with ...``, or None."""
    found = provided_by(kind, name, installed)
    return f"the `{name}` {_WHAT[kind]} is {found}" if found else None


def installed_distributions() -> set[str]:
    """The names of the installed distributions that register with edgebuild."""
    from importlib.metadata import entry_points

    return {ep.dist.name for ep in entry_points(group="edgebuild") if ep.dist is not None}
