"""Serving several job databases from one process: one Worker per database, run side by side.

Each database gets a whole worker of its own (its dispatcher thread and connection,
listener, executor threads, event loop, heartbeat row, upkeep and rescue of expired
leases), so that a busy database never takes a quiet one's slots, and one that goes
down stops only its own jobs while its worker reconnects (django_jobs.worker.guard).
The options (concurrency, batch, ...) are each worker's: per database.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from django.db import connections

from django_jobs.worker.dispatcher import Worker
from django_jobs.worker.runs import DatabaseAway, HandlersStuck

logger = logging.getLogger("django_jobs.worker")


class Workers:
    """Run one Worker per database until stopped (or, in burst mode, until all are idle)."""

    def __init__(self, databases: Sequence[str], **options: Any) -> None:
        if not databases:
            raise ValueError("Workers: no database to serve")
        self.workers = [Worker(database=alias, **options) for alias in databases]
        self._failed: list[BaseException] = []

    @property
    def databases(self) -> list[str]:
        return [worker.database for worker in self.workers]

    def stop(self) -> None:
        """Ask every worker to stop (each lets its running jobs finish within its grace)."""
        for worker in self.workers:
            worker.stop()

    def run(self) -> None:
        """Run the first worker on this thread and the others on threads of their own.

        Returns once every worker has returned. A worker that fails (HandlersStuck, a
        bug) stops the others, and its exception is raised here once they have stopped;
        a burst worker whose database is away (DatabaseAway) lets the others finish.
        """
        if len(self.workers) == 1:
            self.workers[0].run()
            return
        threads = [
            threading.Thread(
                target=self._run, args=(worker,), name=f"django-jobs-{worker.database}"
            )
            for worker in self.workers[1:]
        ]
        for thread in threads:
            thread.start()
        try:
            self._run(self.workers[0])
        finally:
            for thread in threads:
                thread.join()
        if self._failed:
            stuck = [exc for exc in self._failed if isinstance(exc, HandlersStuck)]
            raise (stuck or self._failed)[0]

    def _run(self, worker: Worker) -> None:
        try:
            worker.run()
        except DatabaseAway as exc:
            logger.error("worker %s: %s", worker.id, exc)
            self._failed.append(exc)
        except BaseException as exc:
            if not isinstance(exc, HandlersStuck):
                logger.exception(
                    "worker %s (database %r) failed: stopping the others",
                    worker.id,
                    worker.database,
                )
            self._failed.append(exc)
            self.stop()
        finally:
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()  # this thread's: Django's are per thread
