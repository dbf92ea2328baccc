"""The serving loop's view of ``inbox/``: its specs oldest first, read again only when they change.

The agent looks at its inbox every ``--poll-s`` (0.1 s).  With a thousand jobs waiting for a slot,
re-reading every spec each time cost a fifth of a core.  Every change the controller or the agent
makes to the inbox is a create, rename or unlink of a spec file (enqueue writes ``.tmp`` and renames
it in; a claim or withdraw renames it out), and each of those changes the directory's mtime.  So:

* the listing is taken again only when the directory's (mtime, inode) changed, when its mtime is
  recent enough that two changes could share one timestamp (``RACY_S``), or every ``RESCAN_S``;
* a spec file is read again only when its (mtime, size, inode) changed;
* ``generation`` moves on whenever the view's content changed, so the loop can tell that a round with
  the same inbox, the same free slots and the same running jobs would decide nothing new.

stdlib only, Python >= 3.8.
"""

# ruff: noqa: UP031  (%-formatting on purpose, as in the other agent modules)
from __future__ import annotations

import os
import time
from typing import Any

from gpuq_base.gpuq_files import read_json
from gpuq_base.gpuq_jobspec import JobSpec, spec_or_reason

RACY_S = 2.0  # a directory changed this recently is listed again (coarse timestamps)
RESCAN_S = 5.0  # and every directory is listed again at least this often


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class InboxView:
    def __init__(self, path: str) -> None:
        self.path = path
        self.generation = 0
        self._dir: tuple[int, int, int] | None = None
        self._listed_at = -RESCAN_S
        self._files: dict[str, tuple[tuple[int, int, int], float, Any]] = {}  # job id -> (stat key, created, spec)
        self._order: list[tuple[float, str, Any]] = []

    def _fresh(self, now: float, mono: float) -> bool:
        """True when the last listing still holds (``now``: the wall clock file times are on; ``mono``:
        the clock the rescan period runs on, which a wall-clock step back cannot stall)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self._dir is None and not self._files
        key = _key(st)
        if key != self._dir or mono - self._listed_at >= RESCAN_S or now - st.st_mtime_ns / 1e9 < RACY_S:
            self._dir = key
            return False
        return True

    def specs(self) -> list[tuple[float, str, Any]]:
        """(created_at, job id, spec) of every inbox spec, oldest first (then by job id): a ``JobSpec``, or
        for a file that is not a sound spec the reason it is refused (gpuq_jobspec.spec_or_reason)."""
        mono = time.monotonic()
        if self._fresh(time.time(), mono):
            return self._order
        self._listed_at = mono
        try:
            names = os.listdir(self.path)
        except OSError:
            names = []
        files: dict[str, tuple[tuple[int, int, int], float, Any]] = {}
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            job_id = name[:-5]
            try:
                key = _key(os.stat(os.path.join(self.path, name)))
            except OSError:
                continue  # claimed or withdrawn since the listing
            seen = self._files.get(job_id)
            if seen is not None and seen[0] == key:
                files[job_id] = seen
                continue
            spec = spec_or_reason(read_json(os.path.join(self.path, name)))  # a str: why it is refused
            files[job_id] = (key, spec.created_at if isinstance(spec, JobSpec) else 0.0, spec)
        if files != self._files:
            self._files = files
            self._order = sorted(((c, job_id, spec) for job_id, (_k, c, spec) in files.items()),
                                 key=lambda e: (e[0], e[1]))
            self.generation += 1
        return self._order

    def taken(self, job_id: str) -> None:
        """The agent moved this spec out of the inbox itself (claimed or failed)."""
        if self._files.pop(job_id, None) is not None:
            self._order = [e for e in self._order if e[1] != job_id]
            self.generation += 1
