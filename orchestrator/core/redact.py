"""Redaction of secrets from host text before the controller stores, shows or sends it.

Host text (a setup hook's log tail, scan lines, progress lines, agent messages) can carry the
values of the variables a sweep forwards (``[run] forward_env``): a setup hook that echoes its
token and fails would otherwise put the token in the ledger's events and attempt rows, hence in
``gpuq status``, ``--json`` and the webhook.  The controller knows the values (it read them from
its own environment to forward them), so it replaces each with ``[redacted:NAME]`` wherever host
text is written to the ledger (``ledger/store.py``) or sent (``tick/notify.py``).  Common token shapes
(GitHub, OpenAI/Anthropic-style ``sk-``, AWS access key ids, Slack, Hugging Face, GitLab, bearer
headers) are replaced by ``[redacted]`` whether or not they were forwarded.

Limits (docs/security.md): a value shorter than ``MIN_LENGTH`` is not replaced (it would blank
ordinary words); only the values present in the controller process's environment are known (a
later ``gpuq status`` in a shell without them redacts the token shapes only; the agent redacts on
its side, where it always has the values); a value cut by a host's tail is caught at the cut when
at least ``MIN_LENGTH`` of it shows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

MIN_LENGTH = 8  # shorter values are not redacted (a 3-character value would blank ordinary words)
HELD_CHARS = 64 * 1024  # a streamed line longer than this is redacted in pieces (``stream``)
MARK = "[redacted]"

_SHAPES = re.compile(
    r"\b(?:"
    r"gh[pousr]_[A-Za-z0-9]{30,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{40,}"
    r"|sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"  # OpenAI / Anthropic style keys
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack tokens
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|rpa_[A-Za-z0-9]{30,}"  # RunPod
    r")"
    r"|(?i:\bbearer\s+)[A-Za-z0-9._~+/=-]{16,}"
)


def _bearer_kept(match: re.Match[str]) -> str:
    text = match.group(0)
    if text[:6].lower() == "bearer":
        return text.split()[0] + " " + MARK
    return MARK


@dataclass(frozen=True)
class Redactor:
    """Replaces known secret values (longest first) and common token shapes in text."""

    values: tuple[tuple[str, str], ...] = ()  # (value, NAME), longest value first
    _pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, secrets: Mapping[str, str]) -> Redactor:
        """A redactor for ``{NAME: value}``; values shorter than MIN_LENGTH are left out."""
        pairs = sorted({(v, n) for n, v in secrets.items() if isinstance(v, str) and len(v) >= MIN_LENGTH},
                       key=lambda p: (-len(p[0]), p[1]))
        if not pairs:
            return cls()
        pattern = re.compile("|".join(re.escape(v) for v, _ in pairs))
        return cls(tuple(pairs), pattern)

    def text(self, text: str) -> str:
        """``text`` with every known value and token shape replaced."""
        if not text:
            return text
        if self._pattern is not None:
            names = dict(self.values)
            text = self._pattern.sub(lambda m: f"[redacted:{names[m.group(0)]}]", text)
            text = self._cut(text, names)
        return _SHAPES.sub(_bearer_kept, text)

    def _cut(self, text: str, names: Mapping[str, str]) -> str:
        """A value cut by a tail or a truncation: its end opening the text, its start closing it."""
        for value, name in self.values:
            for size in range(len(value) - 1, MIN_LENGTH - 1, -1):
                if text.startswith(value[-size:]):
                    text = f"[redacted:{name}]" + text[size:]
                    break
            for size in range(len(value) - 1, MIN_LENGTH - 1, -1):
                if text.endswith(value[:size]):
                    text = text[:-size] + f"[redacted:{name}]"
                    break
        return text

    def value(self, value: Any) -> Any:
        """Strings redacted inside any JSON-like value (dicts, lists); other values as they are."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value


def from_environment(names: Iterable[str], environ: Mapping[str, str] | None = None) -> Redactor:
    """The redactor for the forwarded ``names`` whose values this process's environment holds."""
    environ = os.environ if environ is None else environ
    return Redactor.of({name: environ[name] for name in names if name in environ})


def stream(chunks: Iterable[str], redact: Callable[[str], str]) -> Iterator[str]:
    """``chunks`` of one text as it is read (a log followed while it grows), redacted whole lines at a time,
    so that a value split between two chunks is joined before it is replaced: the last line without its
    end waits for the next chunk (up to ``HELD_CHARS`` of it) and goes out when the chunks end."""
    held = ""
    for chunk in chunks:
        text = held + chunk
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1
        if not cut and len(text) > HELD_CHARS:
            cut = len(text)
        held = text[cut:]
        if cut:
            yield redact(text[:cut])
    if held:
        yield redact(held)
