"""Ordered schema migrations, tracked in SQLite's ``PRAGMA user_version``.

Each migration is a function taking a DB-API connection inside one
transaction.  Never edit a released migration: append a new one.  A ledger
whose version is newer than the newest migration was written by a newer
gpuq and is refused rather than silently misread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import SQLModel

from orchestrator.errors import LedgerVersionError
from orchestrator.ledger import tables  # noqa: F401  (registers the tables)


def _v1_initial(conn: sqlite3.Connection) -> None:
    from sqlalchemy.dialects import sqlite

    dialect = sqlite.dialect()
    for table in SQLModel.metadata.sorted_tables:
        conn.execute(str(CreateTable(table).compile(dialect=dialect)))
        for index in table.indexes:
            conn.execute(str(CreateIndex(index).compile(dialect=dialect)))


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1_initial]
SCHEMA_VERSION = len(MIGRATIONS)


def current_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def migrate(conn: sqlite3.Connection, path: str) -> int:
    """Apply every pending migration, each in its own transaction; return the version."""
    version = current_version(conn)
    if version > SCHEMA_VERSION:
        raise LedgerVersionError(
            f"{path}: ledger schema v{version} is newer than this gpuq understands "
            f"(v{SCHEMA_VERSION}); upgrade gpuq or point GPUQ_HOME elsewhere"
        )
    for number in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if current_version(conn) >= number:  # another process migrated meanwhile
                conn.execute("ROLLBACK")
                continue
            MIGRATIONS[number - 1](conn)
            conn.execute(f"PRAGMA user_version = {number}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION
