"""What must hold in every ledger a test leaves behind (checked after each integration test by
tests/integration/conftest.py; docs/cost.md, "An attempt always ends"):

- no job in a terminal state (SUCCEEDED, FAILED, CANCELLED) has an attempt still STARTING or RUNNING;
- no attempt that ended, and had started, lacks its end time (its cost would grow with the wall clock).

One plain sqlite3 read, no gpuq import: it checks the file as any reader would find it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from orchestrator.core.states import ATTEMPT_TERMINAL, JOB_TERMINAL, AttemptState

LEDGER_FILE = "ledger.db"
PATTERNS = (LEDGER_FILE, f"*/{LEDGER_FILE}", f"*/*/{LEDGER_FILE}")  # a test's homes lie at most this deep
_LIVE = (AttemptState.STARTING.value, AttemptState.RUNNING.value)


def _marks(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in sorted(values))


QUERY = (
    "SELECT j.id, j.state, a.number, a.state, a.started_at, a.ended_at FROM job j "
    "JOIN attempt a ON a.job_id = j.id WHERE "
    f"(j.state IN ({_marks(s.value for s in JOB_TERMINAL)}) AND a.state IN ({_marks(_LIVE)})) "
    f"OR (a.state IN ({_marks(s.value for s in ATTEMPT_TERMINAL)}) AND a.started_at IS NOT NULL "
    "AND a.ended_at IS NULL) LIMIT 20"
)


def broken(db: Path) -> list[str]:
    """One line per attempt of ``db`` that breaks an invariant (empty: the ledger holds them)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"job", "attempt"} <= tables:
            return []
        rows = conn.execute(QUERY).fetchall()
    finally:
        conn.close()
    out = []
    for job_id, job_state, number, state, started, ended in rows:
        if state in _LIVE:
            out.append(f"{db}: job {job_id} is {job_state} but its attempt {number} is still {state}")
        else:
            out.append(
                f"{db}: attempt {number} of job {job_id} is {state} with no end time "
                f"(started {started}, ended {ended}): its cost grows with the clock"
            )
    return out


def ledgers_under(root: Path) -> list[Path]:
    """The ledgers a test left under its ``tmp_path`` (its GPUQ_HOMEs)."""
    found: set[Path] = set()
    for pattern in PATTERNS:
        found.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(found)


def check_all(root: Path) -> list[str]:
    return [line for db in ledgers_under(root) for line in broken(db)]
