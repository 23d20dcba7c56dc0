"""Running store/sql.py's statements on PostgreSQL: one round trip each, prepared when safe.

``run`` executes one statement on an alias's connection through a server-side-binding
psycopg cursor; ``run_locked`` sends a flow-limited claim with its advisory lock in one
pipeline. ``prepares`` decides whether a statement runs prepared (see its docstring and
docs/configuration.md#prepared-statements).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import connections

from django_jobs import conf

logger = logging.getLogger("django_jobs.worker")


def run(alias: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Execute a statement of this module on alias's connection and return its rows.

    It uses a server-side-binding psycopg cursor, so that each statement run in
    autocommit (the worker's) is parsed and planned once per connection (a
    prepared statement) instead of at every call: see ``prepares``. Errors come
    out as django.db exceptions, as from any Django cursor.
    """
    import psycopg  # only PostgreSQL needs it

    connection = connections[alias]
    started = time.monotonic() if connection.queries_logged else 0.0
    with connection.wrap_database_errors:
        # Connect first, as Django's cursors do: connect() clears the needs_rollback
        # a connection closed inside an atomic block keeps after it (run_from_argv
        # closes every connection when a command ends).
        connection.ensure_connection()
        connection.validate_no_broken_transaction()
        # One cursor per connection, kept: making one copies the adapters map each time.
        cursor = getattr(connection, "_django_jobs_cursor", None)
        if cursor is None or cursor.connection is not connection.connection or cursor.closed:
            cursor = psycopg.Cursor(connection.connection)
            connection._django_jobs_cursor = cursor  # type: ignore[attr-defined]  # kept on it
        prepare = prepares(connection)
        try:
            cursor.execute(statement, params, prepare=prepare)
        except (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement):
            if not prepare:
                raise
            _prepared_statements_lost(connection)  # a pooler: run it unprepared from now on
            cursor.execute(statement, params, prepare=False)
        rows = cursor.fetchall() if cursor.description else []
    if started:
        connection.queries_log.append(
            {"sql": " ".join(statement.split()), "time": f"{time.monotonic() - started:.3f}"}
        )
    return rows


# Flow control (docs/flow-control.md): take the transaction-scoped advisory lock
# of each limited group, in the order given (sorted by the caller, so that two
# claims never wait on each other in a cycle). Held to the end of the claim's
# transaction: the next claimer of a group counts after this one committed.
FLOW_LOCK = """
SELECT pg_advisory_xact_lock(hashtextextended('django_jobs.flow:' || k, 0))
FROM unnest(%s::text[]) AS k
"""


# Set once a connection of this process lost its prepared statements (a transaction
# pooler hands each transaction to any server session): nothing is prepared after.
_UNPREPARED: list[str] = []


def prepares(connection: Any) -> bool:
    """Whether the hot statements run prepared on this connection now.

    When DJANGO_JOBS["PREPARED_STATEMENTS"] is on and the connection is in
    autocommit (the worker's statements, each its own transaction): a failure
    there (a pooler that lost the statement) leaves no transaction to roll back,
    and the statement runs again unprepared. Django turns psycopg's preparing off
    (prepare_threshold None); it is turned on here, with a threshold no statement
    reaches, so that only these statements, asked with prepare=True, are prepared,
    never Django's own queries (a project's OPTIONS prepare_threshold is kept).
    """
    if not conf.get("PREPARED_STATEMENTS") or _UNPREPARED or not connection.get_autocommit():
        return False
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _NEVER_BY_COUNT
    return True


# psycopg prepares a statement run this many times even without prepare=True.
_NEVER_BY_COUNT = 2**31 - 1


def _prepared_statements_lost(connection: Any) -> None:
    logger.warning(
        "database %r lost a prepared statement of django-jobs (a transaction pooler such as "
        "PgBouncer < 1.21?): this process runs its statements unprepared from now on. Set "
        "DJANGO_JOBS['PREPARED_STATEMENTS'] = False (and POOLER = 'transaction') to say so.",
        connection.alias,
    )
    _UNPREPARED.append(connection.alias)


def run_locked(
    alias: str,
    key: str,
    statement: str,
    params: Any,
    *,
    before: tuple[str, Any] | None = None,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Run statement after FLOW_LOCK of key, in one transaction sent in one round trip.

    BEGIN, `before` (a statement and its parameters: the settle of the jobs whose
    slots the claim refills), the lock, the statement and COMMIT go out together
    (psycopg's pipeline mode); the server still runs them in order, so the
    statement's snapshot is taken once the lock is granted, and it sees what
    `before` wrote. Returns the rows of `before` and of statement; an error rolls
    both back. The connection must be in autocommit.
    """
    connection = connections[alias]
    with connection.wrap_database_errors:
        # Connect first: see run.
        connection.ensure_connection()
        connection.validate_no_broken_transaction()
        raw = connection.connection
        # Django's cursors (client-side binding): never prepared, whatever `prepares` says.
        first, lock, cursor = raw.cursor(), raw.cursor(), raw.cursor()
        try:
            with raw.pipeline(), raw.transaction():
                if before is not None:
                    first.execute(before[0], before[1])
                lock.execute(FLOW_LOCK, [[key]])
                cursor.execute(statement, params)
            earlier: list[tuple[Any, ...]] = first.fetchall() if before is not None else []
            rows: list[tuple[Any, ...]] = cursor.fetchall()
            return earlier, rows
        finally:
            first.close()
            lock.close()
            cursor.close()
