"""Regular expressions compiled on first use: every agent call is a fresh interpreter, and compiling
the ~40 patterns of the modules ``status`` imports cost more than anything else it does at start-up
(cProfile: ``re._parser``), though most calls use few of them (docs/performance.md, agent status).

``lazy(pattern, flags)`` stands where ``re.compile(pattern, flags)`` stood and answers the same
methods; it compiles once, the first time one is called.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Iterator


class LazyPattern:
    """``re.compile(pattern, flags)``, compiled when first used."""

    __slots__ = ("_source", "_flags", "_compiled")

    def __init__(self, source: str, flags: int = 0) -> None:
        self._source = source
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(self._source, self._flags)
        return self._compiled

    @property
    def pattern(self) -> str:
        return self._source

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.search(string, pos, endpos)

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.match(string, pos, endpos)

    def fullmatch(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.fullmatch(string, pos, endpos)

    def finditer(self, string: str) -> Iterator[re.Match[str]]:
        return self.compiled.finditer(string)

    def findall(self, string: str) -> list[Any]:
        return self.compiled.findall(string)

    def split(self, string: str, maxsplit: int = 0) -> list[str | Any]:
        return self.compiled.split(string, maxsplit)

    def sub(self, repl: str, string: str, count: int = 0) -> str:
        return self.compiled.sub(repl, string, count)


def lazy(source: str, flags: int = 0) -> LazyPattern:
    return LazyPattern(source, flags)
