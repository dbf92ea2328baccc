"""The frame around a host's document, its JSON, and the one error a host's answer can raise.

Each reader takes the agent's raw stdout, cuts the framed document out of any shell start-up noise
(``~/.bashrc`` echoes, conda banners) and parses its JSON; anything else raises ``ProtocolError``,
and only that: the tick marks that one host "protocol error: ..." and goes on with the others.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.core import documents
from orchestrator.core.errors import GpuqError
from orchestrator.host_documents.bounds import MAX_DOCUMENT_CHARS

BEGIN_MARK = documents.DOCUMENT_BEGIN  # the agent prints each document between these two lines
END_MARK = documents.DOCUMENT_END
NOISE_SHOWN = 200  # characters of shell noise quoted in the warning


class ProtocolError(GpuqError):
    """A host answered with something that is not a gpuq document: that host only is affected."""

    def __init__(self, host: str, detail: str) -> None:
        self.host = host
        self.detail = detail
        super().__init__(f"host {host}: protocol error: {detail}")


_warned: set[str] = set()
_warned_lock = threading.Lock()


def unframe(stdout: str) -> tuple[str, str]:
    """(the document's text, the noise around it).  An agent of an older bundle prints its
    document unframed: then the whole output is the document."""
    lines = stdout.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN_MARK]
    if not begins:
        return stdout.strip(), ""
    start = begins[-1]
    ends = [i for i in range(start + 1, len(lines)) if lines[i].strip() == END_MARK]
    if not ends:
        return "", stdout.strip()
    end = ends[0]
    noise = "\n".join(lines[:start] + lines[end + 1:]).strip()
    return "\n".join(lines[start + 1:end]).strip(), noise


def warn_noise(host: str, noise: str) -> None:
    """Shell start-up output around an agent document: ignored, said once per host and process."""
    if not noise:
        return
    with _warned_lock:
        if host in _warned:
            return
        _warned.add(host)
    shown = noise[:NOISE_SHOWN].encode("unicode_escape", "replace").decode("ascii", "replace")
    print(f"gpuq: warning: host {host}: its shell start-up files print text around the agent's answer "
          f"(ignored): {shown!r}; remove the output from that login's ~/.bashrc or ~/.profile",
          file=sys.stderr)


def load(host: str, stdout: str) -> Any:
    """The JSON value the agent printed, unframed; ProtocolError when there is none."""
    if len(stdout) > MAX_DOCUMENT_CHARS:
        raise ProtocolError(host, f"the agent's answer is {len(stdout)} characters (more than "
                                  f"{MAX_DOCUMENT_CHARS})")
    text, noise = unframe(stdout)
    if not text:
        raise ProtocolError(host, "the agent printed no document" + (f": {_quote(noise)}" if noise else ""))
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(host, f"the agent's answer is not JSON: {_quote(text)}") from exc
    warn_noise(host, noise)
    return value


M = TypeVar("M", bound=BaseModel)


def validate(host: str, what: str, model: type[M], value: Any) -> M:
    """``value`` checked against ``model``; ProtocolError naming the first fault."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        where, msg = (".".join(str(p) for p in errors[0]["loc"]), errors[0]["msg"]) if errors else ("", str(exc))
        raise ProtocolError(host, f"bad {what} document ({where or 'the document'}: {msg[:200]})") from None
    except (RecursionError, ValueError, TypeError) as exc:
        raise ProtocolError(host, f"bad {what} document ({type(exc).__name__})") from None


def _quote(text: str) -> str:
    return repr(text[:NOISE_SHOWN]) + ("…" if len(text) > NOISE_SHOWN else "")
