"""The dispatcher's database access: connection errors retried later, refusals reported.

Every statement the dispatcher sends goes through DbGuard.run: a lost connection
(or a restarted server) is logged, closed and retried with backoff, the dispatcher
pausing meanwhile; a statement the database refuses (a value, a trigger, a
constraint) comes back as a DbRefused for a settle to record against its job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from django_jobs.attempts import MAX_MESSAGE, type_name
from django_jobs.payloads import safe_str, storable_text
from django_jobs.store import JobStore
from django_jobs.worker.executor import close_quietly
from django_jobs.worker.listener import RETRY_MAX, RETRY_MIN
from django_jobs.worker.settle import DbRefused

logger = logging.getLogger("django_jobs.worker")

_DB_ERRORS = (OperationalError, InterfaceError)


class DbGuard:
    """Run the dispatcher's operations on its connection (the one seam they all go through)."""

    def __init__(self, *, database: str, worker_id: str, pause: Callable[[float], None]) -> None:
        self._database = database
        self._store = JobStore(database)
        self._worker_id = worker_id
        self._pause = pause
        self._failures = 0
        self._away_since: float | None = None  # monotonic: the first of these failures

    def away_for(self, now: float) -> float:
        """How long the database has failed every statement (0 while it answers)."""
        return 0.0 if self._away_since is None else now - self._away_since

    def run(self, operation: Callable[[], Any], *, settle: bool = False) -> Any:
        """Run operation; on a connection error, reconnect later and return None.

        With `settle`, any other error (the database refused this row's write:
        a value, a trigger, a constraint) comes back as a DbRefused, for the
        caller to record against that one job instead of retrying it forever.
        """
        conn = connections[self._database]
        try:
            result = operation()
        except Exception as exc:
            if not isinstance(exc, _DB_ERRORS) or self._store.refused(exc):
                if self._store.dropped_connection(exc):  # reconnect at the next use
                    close_quietly(conn)
                return self._refused_by_db(exc, settle=settle)
            self._failures += 1
            if self._away_since is None:
                self._away_since = time.monotonic()
            pause = min(RETRY_MAX, RETRY_MIN * 2 ** min(self._failures - 1, 10))
            logger.warning(
                "worker %s: database error (%s); retrying in %.1fs",
                self._worker_id,
                storable_text(safe_str(exc), MAX_MESSAGE),
                pause,
            )
            close_quietly(conn)
            self._pause(pause)
            return None
        self._failures = 0
        self._away_since = None
        return result

    def _refused_by_db(self, exc: Exception, *, settle: bool) -> DbRefused | None:
        """Handle a failed statement (a value, a constraint, a trigger): the connection is fine."""
        if not settle:
            if not isinstance(exc, DatabaseError):
                raise exc
            logger.exception("worker %s: database operation failed", self._worker_id, exc_info=exc)
            self._pause(RETRY_MIN)
            return None
        # Capped: PostgreSQL's error context can quote megabytes of the value.
        logger.error(
            "worker %s: the database refused a settle (%s: %s)",
            self._worker_id,
            type_name(exc),
            storable_text(safe_str(exc), MAX_MESSAGE),
            exc_info=exc if not isinstance(exc, DatabaseError) else None,
        )
        return DbRefused(exc)
