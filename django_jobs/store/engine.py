"""The engine seam: one strategy object per database alias, chosen once and cached.

``engine(alias)`` answers the part of each state change that differs by database:
``postgres.Postgres`` (one statement per hot path, from sql.py), ``mysql.MySQL``
(the ORM path with InnoDB's quirks: index hints, locked deletes, packet sizes) and
``portable.Portable`` (the ORM path as SQLite runs it). The concern modules call
it; nothing else in the store asks which database it talks to.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import OperationalError, connections

from django_jobs.store.mysql import MySQL
from django_jobs.store.portable import Portable
from django_jobs.store.postgres import Postgres

_ENGINES: dict[str, Portable] = {}


def engine(alias: str) -> Portable:
    """Return the engine of a database alias: picked by its vendor at first use, then kept."""
    found = _ENGINES.get(alias)
    if found is None:
        vendor = connections[alias].vendor
        found = (
            Postgres() if vendor == "postgresql" else MySQL() if vendor == "mysql" else Portable()
        )
        _ENGINES[alias] = found
    return found


# How many times an enqueue after parents is tried when the database picks it as a
# deadlock's victim: what no lock order rules out (rows the application locks out
# of id order, a dependent committed while a settle waited for its parent). Each
# lost try has waited deadlock_timeout.
DEADLOCK_TRIES = 5
_PG_DEADLOCK = "40P01"
_MYSQL_DEADLOCK = 1213


def is_deadlock(exc: BaseException) -> bool:
    """Whether exc is the database's "deadlock detected" (PostgreSQL, MySQL and MariaDB)."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == _PG_DEADLOCK:
        return True
    return bool(exc.args) and exc.args[0] == _MYSQL_DEADLOCK


def retrying_deadlocks[T](alias: str, write: Callable[[], T]) -> T:
    """Run write (one transaction.atomic block), again when it lost a deadlock.

    The victim's block is rolled back, and with it the row locks it took: on
    PostgreSQL a savepoint's rollback releases them, so a write inside the
    caller's transaction is tried again in place. MySQL and MariaDB roll the
    whole transaction back: only a write that is its own transaction is retried
    there; inside the caller's, the error reaches the caller, whose transaction
    is gone.
    """
    own_transaction = not connections[alias].in_atomic_block
    for tries_left in range(DEADLOCK_TRIES - 1, -1, -1):
        try:
            return write()
        except OperationalError as exc:
            retry = (
                tries_left
                and is_deadlock(exc)
                and (own_transaction or engine(alias).retries_inside_transaction)
            )
            if not retry:
                raise
    raise AssertionError("unreachable")  # pragma: no cover
