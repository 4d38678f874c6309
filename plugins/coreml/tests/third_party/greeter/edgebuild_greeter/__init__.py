"""edgebuild-greeter: registers ``edgebuild greet`` and nothing a build calls."""

from __future__ import annotations

from edgebuild.plugin import hookimpl


def greet(name: str = "world") -> None:
    """Say hello."""
    print(f"hello, {name}")


@hookimpl
def edgebuild_register_commands(register):
    register("greet", lambda: greet)
