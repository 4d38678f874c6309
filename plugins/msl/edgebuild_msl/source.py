"""Reading MSL text: comments blanked out (line numbers kept), line lookup, bracket matching."""

from __future__ import annotations

import re

_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', re.S)


def strip_comments(text: str) -> str:
    """Comments become spaces (newlines kept), so offsets and line numbers still match."""

    def blank(match: re.Match) -> str:
        token = match.group(0)
        if token.startswith('"'):
            return token
        return re.sub(r"[^\n]", " ", token)

    return _COMMENT_OR_STRING.sub(blank, text)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def matching_paren(text: str, open_at: int) -> int:
    """Offset of the ``)`` closing the ``(`` at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced parentheses")


def split_top_level(text: str, sep: str = ",") -> list[tuple[int, str]]:
    """Split at ``sep`` outside (), [] and <>; each part with its offset in ``text``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append((start, text[start:i]))
            start = i + 1
    parts.append((start, text[start:]))
    return [(off, part) for off, part in parts if part.strip()]
