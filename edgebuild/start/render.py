"""A suggestion as recipe YAML a person reads: flow-style entries, each choice's reason as a comment.

The layout is written by hand, because the comments are the point, but no text from the model
(input names, dim names, notes) is ever pasted in: every scalar goes through PyYAML's emitter
(``scalar``), every comment through ``comment``, which escapes whatever would end the comment
line or that a YAML reader refuses. The tests load rendered recipes back through the recipe loader.
"""

from __future__ import annotations

import json
import re

import yaml

from edgebuild.start.suggest import Suggestion

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_YAML_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}
_LONGEST_SIMPLE_KEY = 1000  # YAML readers take an implicit key of at most 1024 characters


def scalar(value) -> str:
    """``value`` as one YAML scalar: an identifier as it is, anything else from PyYAML's emitter
    (strings double-quoted, with every line break and non-printable character escaped)."""
    if isinstance(value, str) and _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
        return value
    if not isinstance(value, (str, bool, int, float, type(None))):
        value = str(value)
    style = '"' if isinstance(value, str) else None
    text = yaml.safe_dump(value, default_style=style, allow_unicode=True, width=float("inf"))
    return text.removesuffix("\n").removesuffix("\n...").strip()


def key(name, indent: str) -> str:
    """``name:`` as a block mapping key; a key too long for an implicit one is written explicitly."""
    text = scalar(name)
    return f"{text}:" if len(text) <= _LONGEST_SIMPLE_KEY else f"? {text}\n{indent}:"


def _printable(ch: str) -> bool:
    """Characters a YAML reader takes inside a comment without ending it (no line breaks:
    YAML 1.1 also breaks lines at U+0085, U+2028 and U+2029)."""
    return (ch == "\t" or " " <= ch <= "~" or ("\xa0" <= ch <= "\ud7ff" and ch not in "\u2028\u2029")
            or ("\ue000" <= ch <= "\ufffd" and ch != "\ufeff") or ch >= "\U00010000")


def comment(text: str) -> str:
    """``text`` as the body of one ``#`` comment line: other characters as JSON-style escapes."""
    return "".join(ch if _printable(ch) else json.dumps(ch)[1:-1] for ch in str(text))


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
    lines = [f"# {comment(h)}" if h else "#" for h in header]
    lines += ["edgebuild: 1", f"name: {scalar(s.name)}", "source:", f"  model: {scalar(model)}"]
    if sha256:
        lines.append(f"  sha256: {scalar(sha256)}")
    lines.append("  inputs:")
    for choice in s.inputs:
        lines += [f"    # {comment(note)}" for note in choice.source_notes]
        spec = {"value": choice.value} if choice.value is not None else {"shape": choice.shape}
        spec["dtype"] = choice.facts.dtype
        lines.append(f"    {key(choice.name, '    ')} {flow(spec)}")
    lines.append(f"target: {flow({'deployment_target': deployment_target, 'precision': precision})}")
    if compression:
        lines.append(f"compression: {flow(compression)}")
    lines += ["validate:", f"  samples: {samples}"]
    entries = []
    for note in s.notes:
        entries.append(f"    # {comment(note)}")
    for choice in s.inputs:
        if choice.validate_note and choice.generator is None and choice.value is None:
            entries.append(f"    # {comment(choice.validate_note)}")
    generated = [c for c in s.inputs if c.generator is not None]
    for choice in generated:
        note = f"  # {comment(choice.validate_note)}" if choice.validate_note else ""
        entries.append(f"    {key(choice.name, '    ')} {flow(choice.generator)}{note}")
    if generated:
        lines += ["  inputs:", *entries]
    else:
        lines += [e[2:] for e in entries] + ["  inputs: {}"]
    lines.append(f"  thresholds: {flow(thresholds)}")
    if variants:
        lines.append("variants:")
        for name, override in variants.items():
            if not override:
                lines.append(f"  {key(name, '  ')} {{}}")
                continue
            lines.append(f"  {key(name, '  ')}")
            lines += [f"    {key(k, '    ')} {flow(v)}" for k, v in override.items()]
    lines.append(f"outputs: {flow({'dir': outputs_dir})}")
    return "\n".join(lines) + "\n"
