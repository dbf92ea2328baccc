"""A VRAM zombie's command line as ``reap`` shows it (gpuq_reap.py): one printable line, at most
MAX_CMDLINE characters, with secret-looking values redacted (key/token/secret/password-like arguments,
auth headers and schemes, URL credentials, well-known token prefixes), in its own words or inside one
argument such as a ``sh -c`` string.  Pure functions (unit-tested).

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import re

MAX_CMDLINE = 1000
SECRET_NAME_RE = re.compile(r"key|token|secret|passw(?:or)?d|pass(?:phrase)?$|pwd|credential|auth|cookie",
                            re.IGNORECASE)
SECRET_VALUE_RE = re.compile(r"^(?:sk-|hf_|ghp_|gho_|github_pat_|xox[abpr]-|AKIA|glpat-)[A-Za-z0-9_\-]{8,}")
URL_CRED_RE = re.compile(r"://[^/@\s:]+:[^/@\s]+@")
ASSIGN_RE = re.compile(r"^(-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$")
HEADER_WORD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):$")  # "Authorization:" as a word of its own
AUTH_SCHEMES = ("bearer", "basic", "token", "digest", "negotiate", "apikey")
# inside one argument (a `sh -c` string, a curl header): NAME=value (quoted or not), a secret-named
# header's value, an auth scheme's credentials, and -pPASSWORD (mysql, sshpass)
INLINE_ASSIGN_RE = re.compile(r"(?<![A-Za-z0-9_.\-])(-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)="
                              r"(\"(?:[^\"\\]|\\.)*\"?|'[^']*'?|[^\s;&|]+)")
INLINE_HEADER_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*([^\r\n\"']+)")
INLINE_SCHEME_RE = re.compile(r"\b(%s)[ \t]+[^\s\"']+" % "|".join(AUTH_SCHEMES), re.IGNORECASE)
INLINE_SHORT_P_RE = re.compile(r"(^|[\s\"'])-p([^\s\"';&|]+)")
REDACTED = "<redacted>"


def _redact_inline(text: str) -> str:
    """Secrets inside one argument: ``KEY="..."``, ``--api-key=x``, ``Authorization: Bearer x``,
    ``X-Api-Key: x``, ``Bearer x``, ``-pPASSWORD``, ``https://user:pass@host``."""
    def assign(m: re.Match[str]) -> str:
        return m.group(1) + "=" + REDACTED if SECRET_NAME_RE.search(m.group(1)) else m.group(0)

    def header(m: re.Match[str]) -> str:
        return m.group(1) + ": " + REDACTED if SECRET_NAME_RE.search(m.group(1)) else m.group(0)

    text = INLINE_ASSIGN_RE.sub(assign, text)
    text = INLINE_HEADER_RE.sub(header, text)
    text = INLINE_SCHEME_RE.sub(lambda m: m.group(1) + " " + REDACTED, text)
    text = INLINE_SHORT_P_RE.sub(lambda m: m.group(1) + "-p" + REDACTED, text)
    return URL_CRED_RE.sub("://" + REDACTED + "@", text)


def redact(argv: list[str]) -> str:
    """The command line with secret-looking values replaced: ``--api-key=x``, ``WANDB_API_KEY=x``,
    ``--token x`` (the value after a secret-named flag), ``https://user:pass@host``, ``hf_...``,
    ``-H "Authorization: Bearer x"`` (also split into words), ``-pPASSWORD``, and the same inside one
    argument such as a ``sh -c`` string (``API_KEY="x" python train.py``)."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            hide_next = False
            if not a.startswith("-"):
                out.append(REDACTED)
                hide_next = a.lower() in AUTH_SCHEMES  # "Authorization:" "Bearer" "x": the credentials too
                continue
        m = ASSIGN_RE.match(a)
        if m and SECRET_NAME_RE.search(m.group(1)) and not m.group(2).startswith(("'", '"')):
            out.append(m.group(1) + "=" + REDACTED)  # the whole rest: `env KEY="a b"` passes KEY=a b
            continue
        if a.startswith("-") and "=" not in a and SECRET_NAME_RE.search(a):
            out.append(a)
            hide_next = True
            continue
        word = HEADER_WORD_RE.match(a)
        if (word and SECRET_NAME_RE.search(word.group(1))) or a.lower() in AUTH_SCHEMES:
            out.append(a)
            hide_next = True
            continue
        if SECRET_VALUE_RE.match(a):
            out.append(REDACTED)
            continue
        out.append(_redact_inline(a))
    text = " ".join(out).replace("\n", "\\n").replace("\t", "\\t")
    text = re.sub(r"[\x00-\x1f\x7f]", "?", text)  # one printable line
    return text if len(text) <= MAX_CMDLINE else text[:MAX_CMDLINE] + "..."
