"""python manage.py runjobs: run a worker until SIGTERM/SIGINT (or, with --burst, until idle)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from django_jobs import conf, registry
from django_jobs.management.arguments import (
    add_repeatable,
    async_slots,
    positive_int,
    queue_name,
    seconds,
    seconds_or_zero,
    threads,
)
from django_jobs.management.tables import require_job_tables
from django_jobs.models import QueueState
from django_jobs.worker import EXIT_STUCK, DatabaseAway, HandlersStuck, Worker
from django_jobs.worker.several import Workers

# -v 0: warnings and errors; -v 1 (the default): one line per job outcome too; -v 2+: debug.
LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
logger = logging.getLogger("django_jobs.worker")


@contextlib.contextmanager
def on_stop(graceful: Callable[[], None]) -> Iterator[None]:
    """Call graceful() at the first SIGTERM/SIGINT, exit at once at the second; restore after."""
    received: list[int] = []

    def handle(signum: int, frame: Any) -> None:
        if received:
            logging.getLogger("django_jobs.worker").warning(
                "second %s: exiting now; unfinished leases expire and are rescued",
                signal.Signals(signum).name,
            )
            sys.stderr.flush()
            os._exit(128 + signum)
        received.append(signum)
        graceful()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Command(BaseCommand):
    help = "Run a django-jobs worker: claim due jobs and run their handlers."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_repeatable(
            parser,
            "--queue",
            "-q",
            dest="queues",
            type=queue_name,
            metavar="NAME",
            help="Queue to serve (repeatable). Default: every queue a registered handler names.",
        )
        parser.add_argument(
            "--concurrency",
            "-c",
            type=threads,
            help="Handler threads (default CONCURRENCY, 4).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=async_slots,
            help="Async handlers run at once on the event loop (default ASYNC_CONCURRENCY, 100).",
        )
        parser.add_argument(
            "--batch", type=positive_int, help="Most jobs claimed at once (default BATCH, 100)."
        )
        parser.add_argument("--burst", action="store_true", help="Run what is due, then exit 0.")
        parser.add_argument("--max-jobs", type=positive_int, help="Exit 0 after this many jobs.")
        parser.add_argument(
            "--lease", type=seconds, help="Lease length in seconds (default LEASE, 30)."
        )
        parser.add_argument(
            "--heartbeat",
            type=seconds_or_zero,
            help="Seconds between lease extensions of running jobs; "
            "0 turns them off (default: lease / 3).",
        )
        parser.add_argument(
            "--grace",
            type=seconds_or_zero,
            help="Seconds running jobs get to finish at shutdown, and handlers past their "
            "timeout to return before a worker they all block exits 3 (default GRACE, 30).",
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds,
            help="Seconds between polls (default POLL_INTERVAL, 1).",
        )
        add_repeatable(
            parser,
            "--database",
            dest="databases",
            type=str,
            metavar="ALIAS",
            help="Job database to serve (repeatable). Default: every alias of "
            "DJANGO_JOBS['DATABASES'], each with a worker of its own.",
        )
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help="Poll only, without LISTEN/NOTIFY (for PgBouncer in transaction pooling).",
        )

    def handle(
        self,
        *,
        queues: list[str] | None,
        concurrency: int | None,
        async_concurrency: int | None,
        batch: int | None,
        burst: bool,
        max_jobs: int | None,
        lease: float | None,
        heartbeat: float | None,
        grace: float | None,
        poll_interval: float | None,
        no_listen: bool,
        databases: list[str] | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        self._configure_logging(verbosity)
        served = self._databases(databases)
        try:
            workers = Workers(
                served,
                queues=queues,
                concurrency=concurrency,
                async_concurrency=async_concurrency,
                batch=batch,
                burst=burst,
                max_jobs=max_jobs,
                lease=lease,
                heartbeat=heartbeat,
                grace=grace,
                poll_interval=poll_interval,
                listen=False if no_listen else None,
            )
        except ImproperlyConfigured as exc:  # --heartbeat >= --lease, or bad DJANGO_JOBS values
            raise CommandError(str(exc), returncode=2) from None
        for worker in workers.workers:
            require_job_tables(worker.database)
        self._warn_idle(queues)
        for worker in workers.workers:
            self._warn_paused(worker)
        with on_stop(workers.stop):
            try:
                workers.run()
            except HandlersStuck as exc:  # logged by the worker; only a restart frees threads
                raise CommandError(f"{exc}: exiting for a restart", returncode=EXIT_STUCK) from None
            except DatabaseAway as exc:  # --burst only: a serving worker waits for its database
                raise CommandError(str(exc), returncode=1) from None

    def _databases(self, databases: list[str] | None) -> list[str]:
        aliases = conf.databases()
        if not databases:
            return list(aliases)
        unknown = [alias for alias in databases if alias not in aliases]
        if unknown:
            raise CommandError(
                f"--database {unknown[0]!r} is not a job database: DJANGO_JOBS['DATABASES'] "
                f"holds {', '.join(map(repr, aliases))}",
                returncode=2,
            )
        return list(dict.fromkeys(databases))

    def _warn_idle(self, queues: list[str] | None) -> None:
        """Say so when this worker has nothing it could run."""
        handlers = registry.all_handlers().values()
        if not handlers:
            logger.warning(
                "no job handler is registered, so this worker cannot run any job: declare "
                "@job functions in a jobs.py module of an app in INSTALLED_APPS"
            )
            return
        used = {handler.get_queue() for handler in handlers}
        for name in sorted(set(queues or ()) - used):
            logger.warning(
                "no registered handler declares queue %r: this worker runs its jobs only when "
                "they were enqueued with queue=%r",
                name,
                name,
            )

    def _warn_paused(self, worker: Worker) -> None:
        """Say so when queues this worker serves are paused (a --burst run then runs none)."""
        paused = QueueState.objects.using(worker.database).filter(
            paused=True, name__in=worker.queues
        )
        try:
            rows = list(paused.order_by("name"))
        except DatabaseError:  # the database is away: the worker reconnects and says so
            return
        for row in rows:
            logger.warning(
                "queue %r is paused%s%s%s: no worker claims its jobs until "
                "`python manage.py jobs resume %s`",
                row.name,
                f" on database {worker.database!r}" if len(conf.databases()) > 1 else "",
                f" by {row.paused_by}" if row.paused_by else "",
                f" ({row.reason})" if row.reason else "",
                row.name,
            )

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("django_jobs")
        logger.setLevel(LOG_LEVELS.get(verbosity, logging.DEBUG))
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(cast("TextIO", self.stderr._out))
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logger.addHandler(handler)
