"""The event table's range reads as SQL text, shared by the ORM ``Ledger`` (``events.py``) and the read
path without it (``reader.py``): a subject's events are a range of the subject index, never ``LIKE``."""

from __future__ import annotations

# the newest events of each (subject, upper) pair: a range of the subject index per pair, numbered newest first
NEWEST_EVENTS = ("WITH p(subject, upper) AS (VALUES {values}) "
                  "SELECT subject, id FROM (SELECT p.subject AS subject, e.id AS id, e.rule AS rule, "
                  "row_number() OVER (PARTITION BY p.subject ORDER BY e.id DESC) AS n "
                  "FROM p JOIN event AS e ON e.subject >= p.subject AND e.subject < p.upper) WHERE n <= ?{rule}")


def past_prefix(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` in SQLite's BINARY order (UTF-8
    bytes, which is code point order), so ``prefix <= s < past_prefix(prefix)`` is ``s.startswith(prefix)``;
    None when no string is above them all ("")."""
    while prefix:
        last = ord(prefix[-1]) + 1
        if last <= 0x10FFFF:
            return prefix[:-1] + chr(0xE000 if 0xD800 <= last <= 0xDFFF else last)  # no surrogate in UTF-8
        prefix = prefix[:-1]
    return None
