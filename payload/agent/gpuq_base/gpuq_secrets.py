"""Forwarded secrets on a host: ``secrets/<queue_id>.json`` (0600 in a 0700 dir, written by
``enqueue``), the values a job's ``run.forward_env`` names (docs/security.md).  A root trainer never
sees this dir (gpuq_jail covers it): the wrapper reads its sweep's values and puts them in its environment.

Two duties, both here so every path does them the same way:

- **redaction**: every value held on the host is replaced by ``[redacted]`` in the host text the
  agent reports (exit records with the setup tail, the setup's failed.json, in status entries the
  progress line, scan hits and tracebacks, the heartbeat and the results' summary) before it is
  written where the controller reads it; paths and hashes the controller acts on are left as they are.
  Values shorter than MIN_REDACT_CHARS are not redacted (they cannot be told apart from ordinary
  text), nor text read after the sweep's secrets file is gone (the agent no longer knows them).
- **deletion**: a secrets file goes once no job of its sweep (queue id) is queued or still lives
  here.  The long-running agent, ``cancel``/``withdraw`` and, on a Slurm login node, ``status``
  delete them.  Deleting and ``enqueue`` (which writes the secrets before its specs) hold the same
  flock on the secrets dir, so a sweep being enqueued never loses its secrets.

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any, Callable, Iterator

from gpuq_base import gpuq_protocol as P
from gpuq_base.gpuq_files import Layout, list_specs, read_json
from gpuq_base.gpuq_jobspec import JobSpec, read_spec

MASK = "[redacted]"
MIN_REDACT_CHARS = 4
MAX_VALUES = 1000  # bounded: a host's secrets dir is the controller's, but never trusted blindly


def held_values(lay: Layout) -> list[str]:
    """Every forwarded value held on this host, longest first (a value inside another goes after it)."""
    sdir = lay.p(P.SECRETS_DIR)
    try:
        names = sorted(n for n in os.listdir(sdir) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    found: set[str] = set()
    for name in names:
        doc = read_json(os.path.join(sdir, name))
        if isinstance(doc, dict):
            found.update(str(v) for v in doc.values() if v is not None)
    return sorted((v for v in found if len(v) >= MIN_REDACT_CHARS), key=lambda v: (-len(v), v))[:MAX_VALUES]


def redact(text: str, values: list[str]) -> str:
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact_doc(doc: Any, values: list[str]) -> Any:
    """A copy of a JSON document with every string (keys included) redacted."""
    if not values:
        return doc
    if isinstance(doc, str):
        return redact(doc, values)
    if isinstance(doc, dict):
        return {redact_doc(k, values): redact_doc(v, values) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [redact_doc(v, values) for v in doc]
    return doc


@contextlib.contextmanager
def locked(lay: Layout) -> Iterator[bool]:
    """The secrets dir's flock (yields False when there is no secrets dir: nothing to guard)."""
    try:
        fd = os.open(lay.p(P.SECRETS_DIR), os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # closing drops the flock


def drop_unused(lay: Layout, claimed_lives: Callable[[str, JobSpec], bool]) -> list[str]:
    """Delete the secrets of every sweep none of whose jobs is in the inbox or, claimed, still lives
    by ``claimed_lives(job_id, spec)``.  Returns the
    queue ids deleted.  The inbox is listed before claimed/: a job claimed in between is seen in one
    of the two."""
    sdir = lay.p(P.SECRETS_DIR)
    with locked(lay) as have:
        if not have:
            return []
        try:
            held = [n[:-5] for n in os.listdir(sdir) if n.endswith(".json") and not n.startswith(".")]
        except OSError:
            return []
        if not held:
            return []
        live: set[str] = set()
        for j in list_specs(lay.p(P.INBOX_DIR)):
            s = read_spec(lay.p(P.INBOX_DIR, j + ".json"))
            live.add(s.queue_id if s is not None else "")
        for j in list_specs(lay.p(P.CLAIMED_DIR)):
            s = read_spec(lay.p(P.CLAIMED_DIR, j + ".json"))
            if s is not None and claimed_lives(j, s):
                live.add(s.queue_id)
        dropped = []
        for qid in held:
            if qid not in live:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(sdir, qid + ".json"))
                    dropped.append(qid)
        return dropped
