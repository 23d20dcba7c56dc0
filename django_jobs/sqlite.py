"""SQLite as the jobs database: what its connections need so that web and worker processes share it.

With Python's defaults (DEFERRED transactions, a rollback journal), a transaction
that reads before it writes fails at once with "database is locked" when another
connection writes: a worker's handlers and the web's enqueues meet that all the
time. Each new connection to the jobs database therefore gets IMMEDIATE
transactions and the file WAL journaling, unless its OPTIONS choose otherwise
(checks.check_sqlite then warns).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from django_jobs import conf


def configure(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Give a new connection to the jobs database on SQLite what concurrent use needs."""
    if connection.vendor != "sqlite" or connection.alias != conf.get("DATABASE"):
        return
    options = connection.settings_dict.get("OPTIONS") or {}
    if "transaction_mode" not in options:
        # Read by Django at each BEGIN (set from OPTIONS at connect, so set again here).
        connection.transaction_mode = "IMMEDIATE"
    if connection.is_in_memory_db() or "journal_mode" in str(options.get("init_command", "")):
        return
    try:
        raw = connection.connection
        if raw.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            # Stored in the file: the first connection that gets the lock switches it for all.
            raw.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError:
        pass  # another connection holds the file: a later connection switches it


def missing_options(settings_dict: dict[str, Any]) -> list[str]:
    """Return what a SQLite database's OPTIONS set against concurrent use, as readable notes."""
    options = settings_dict.get("OPTIONS") or {}
    notes = []
    mode = options.get("transaction_mode")
    if "transaction_mode" in options and str(mode).upper() not in ("IMMEDIATE", "EXCLUSIVE"):
        notes.append(f'"transaction_mode" is {mode!r}, not "IMMEDIATE"')
    init = str(options.get("init_command", "")).lower().replace(" ", "")
    if "journal_mode" in init and "journal_mode=wal" not in init:
        notes.append('"init_command" sets a journal_mode other than WAL')
    return notes
