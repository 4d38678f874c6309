"""A suggestion as recipe YAML a person reads: flow-style entries, each choice's reason as a comment.

Written by hand rather than dumped, because the comments are the point; the tests load every
rendered recipe back through the recipe loader.
"""

from __future__ import annotations

import json
import re

from edgebuild.start.suggest import Suggestion

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    return text if _PLAIN.match(text) and text.lower() not in _YAML_WORDS else json.dumps(text)


def flow(value) -> str:
    """``value`` as a YAML flow node."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{scalar(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return scalar(value)


def render(s: Suggestion, *, model: str, sha256: str | None, header: list[str], outputs_dir: str,
           precision: str = "float32", deployment_target: str = "iOS17", compression: dict | None = None,
           thresholds: dict, variants: dict | None = None, samples: int = 8) -> str:
    lines = [f"# {h}" if h else "#" for h in header]
    lines += ["edgebuild: 1", f"name: {scalar(s.name)}", "source:", f"  model: {scalar(model)}"]
    if sha256:
        lines.append(f"  sha256: {sha256}")
    lines.append("  inputs:")
    for choice in s.inputs:
        lines += [f"    # {note}" for note in choice.source_notes]
        spec = {"value": choice.value} if choice.value is not None else {"shape": choice.shape}
        spec["dtype"] = choice.facts.dtype
        lines.append(f"    {scalar(choice.name)}: {flow(spec)}")
    lines.append(f"target: {flow({'deployment_target': deployment_target, 'precision': precision})}")
    if compression:
        lines.append(f"compression: {flow(compression)}")
    lines += ["validate:", f"  samples: {samples}"]
    entries = []
    for note in s.notes:
        entries.append(f"    # {note}")
    for choice in s.inputs:
        if choice.validate_note and choice.generator is None and choice.value is None:
            entries.append(f"    # {choice.validate_note}")
    generated = [c for c in s.inputs if c.generator is not None]
    for choice in generated:
        entries.append(f"    {scalar(choice.name)}: {flow(choice.generator)}  # {choice.validate_note}")
    if generated:
        lines += ["  inputs:", *entries]
    else:
        lines += [e[2:] for e in entries] + ["  inputs: {}"]
    lines.append(f"  thresholds: {flow(thresholds)}")
    if variants:
        lines.append("variants:")
        for name, override in variants.items():
            if not override:
                lines.append(f"  {scalar(name)}: {{}}")
                continue
            lines.append(f"  {scalar(name)}:")
            lines += [f"    {scalar(k)}: {flow(v)}" for k, v in override.items()]
    lines.append(f"outputs: {flow({'dir': outputs_dir})}")
    return "\n".join(lines) + "\n"
