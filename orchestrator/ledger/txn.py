"""How the ledger's SQLite transactions begin: reads deferred, check-and-change writes immediate.

Python's sqlite3 driver opens a transaction only at the first INSERT/UPDATE/DELETE, so a session
that reads a job's state and then changes it would read outside the transaction: two gpuq
commands could both see a job QUEUED and both start it.  The engine here takes the transaction
into its own hands (the driver's autocommit off, an explicit BEGIN at the start of every session):

* ``BEGIN IMMEDIATE`` for a session that may write: SQLite's write lock is taken before the first
  read, so the state a session checks is the state it changes (another writer waits up to the busy
  timeout, never sees "database is locked" unless that long passes);
* ``BEGIN`` (deferred) for a read-only session: a consistent snapshot that blocks nobody (WAL).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session, create_engine

BUSY_TIMEOUT_MS = 15_000
IN_CHUNK = 500  # ids per IN (...) list of one query: well under SQLite's variable limit
IMMEDIATE = "gpuq_immediate"  # the execution option a writing session sets


class Sessions:
    """What a part of the ``Ledger`` (its mixins: ``events.py``, ``results.py``, ``pulls.py``) reads and
    writes through; ``store.Ledger`` gives both, as ``transaction`` begins them."""

    def session(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def reading(self) -> AbstractContextManager[Session]:
        raise NotImplementedError


def ledger_engine(url: str) -> Engine:
    """An engine whose sessions begin their SQLite transaction explicitly (see the module doc)."""
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)
    return engine


@contextmanager
def transaction(engine: Engine, *, write: bool) -> Iterator[Session]:
    """One transaction: committed on success, rolled back on any error.  ``write``: take the write
    lock first (``BEGIN IMMEDIATE``), so what the session reads cannot change before it writes."""
    with engine.connect() as conn:
        conn = conn.execution_options(**{IMMEDIATE: write})
        with Session(bind=conn, expire_on_commit=False) as session, session.begin():
            yield session


def _on_begin(conn: Connection) -> None:
    immediate = conn.get_execution_options().get(IMMEDIATE, True)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # the driver's implicit BEGIN off: _on_begin emits ours
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
