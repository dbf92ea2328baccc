"""Shell completion of JOB, SWEEP and HOST arguments, from the ledger alone.

Completion runs on every Tab press, so it reads ``$GPUQ_HOME/ledger.db`` with the standard
library's sqlite3, read-only: no SSH, no sqlmodel, no rich.  A missing or locked ledger completes
nothing rather than failing.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from click.shell_completion import CompletionItem

LIMIT = 200


def _query(sql: str, *args: object) -> list[tuple[Any, ...]]:
    path = Path(os.environ.get("GPUQ_HOME") or Path.home() / ".gpuq") / "ledger.db"
    if not path.is_file():
        return []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.2)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def _like(incomplete: str) -> str:
    return incomplete.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def jobs(_ctx: Any, _param: Any, incomplete: str) -> list[CompletionItem]:
    """Job names of the newest sweeps, ``SWEEP:NAME`` after a colon, and ids."""
    if ":" in incomplete:
        sweep, name = incomplete.split(":", 1)
        rows = _query("SELECT sweep_id, name, state FROM job WHERE sweep_id = ? AND name LIKE ? ESCAPE '\\' "
                      "ORDER BY line LIMIT ?", sweep, _like(name), LIMIT)
        return [CompletionItem(f"{s}:{n}", help=st) for s, n, st in rows]
    rows = _query("SELECT job.name, job.id, job.sweep_id, job.state FROM job JOIN sweep ON sweep.id = job.sweep_id "
                  "WHERE job.name LIKE ? ESCAPE '\\' OR job.id LIKE ? ESCAPE '\\' "
                  "ORDER BY sweep.created_at DESC, job.line LIMIT ?", _like(incomplete), _like(incomplete), LIMIT)
    items: dict[str, CompletionItem] = {}
    for name, job_id, sweep, state in rows:
        value = name if name.lower().startswith(incomplete.lower()) else job_id
        items.setdefault(value, CompletionItem(value, help=f"{state} in sweep {sweep}"))
    return list(items.values())


def sweeps(_ctx: Any, _param: Any, incomplete: str) -> list[CompletionItem]:
    rows = _query("SELECT id, queue_path FROM sweep WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT ?",
                  _like(incomplete), LIMIT)
    return [CompletionItem(sid, help=str(path)) for sid, path in rows]


def hosts(_ctx: Any, _param: Any, incomplete: str) -> list[CompletionItem]:
    rows = _query("SELECT name, kind FROM host WHERE name LIKE ? ESCAPE '\\' ORDER BY name LIMIT ?",
                  _like(incomplete), LIMIT)
    return [CompletionItem(name, help=str(kind)) for name, kind in rows]
