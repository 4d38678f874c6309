"""Build progress lines on stderr, in colour on a terminal.

`edgebuild run` prints a line per stage; rich would cost a no-op build 40 ms of imports for
that, so run uses this small printer, which understands the few rich-style tags it needs
([bold], [dim], [red], [green], [cyan], closed by [/]).
"""

from __future__ import annotations

import os
import re
import sys

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "cyan": "36", "yellow": "33"}
_TAG = re.compile(r"\[(/|bold|dim|red|green|cyan|yellow)\]")


class Printer:
    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.colour = hasattr(self.stream, "isatty") and self.stream.isatty() and not os.environ.get("NO_COLOR")

    def _render(self, match: re.Match) -> str:
        if not self.colour:
            return ""
        tag = match.group(1)
        return "\033[0m" if tag == "/" else f"\033[{_CODES[tag]}m"

    def print(self, text: str) -> None:
        self.stream.write(_TAG.sub(self._render, str(text)) + "\n")
        self.stream.flush()
