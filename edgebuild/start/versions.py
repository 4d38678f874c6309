"""``edgebuild --version``: edgebuild's version and every installed plugin distribution's,
read from package metadata (no plugin is imported, so a broken plugin cannot hide the answer)."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

from edgebuild._version import __version__


def plugin_versions() -> list[tuple[str, str, list[str]]]:
    """(distribution, version, entry point names) of every plugin in the ``edgebuild`` group."""
    found: dict[str, tuple[str, list[str]]] = {}
    for ep in entry_points(group="edgebuild"):
        dist = ep.dist.name if ep.dist else "?"
        if dist.replace("_", "-").lower() == "edgebuild":  # the core's own built-ins
            continue
        version = ep.dist.version if ep.dist else "?"
        found.setdefault(dist, (version, []))[1].append(ep.name)
    return [(dist, version, names) for dist, (version, names) in sorted(found.items())]


def version_lines() -> list[str]:
    python = ".".join(map(str, sys.version_info[:3]))
    lines = [f"edgebuild {__version__} (Python {python})"]
    plugins = plugin_versions()
    lines += [f"  {dist} {version} (plugin {', '.join(names)})" for dist, version, names in plugins]
    if not plugins:
        lines.append("  no plugins installed: pip install 'edgebuild[coreml]' for the Core ML backend")
    return lines
