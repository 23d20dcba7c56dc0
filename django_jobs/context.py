"""The context a handler receives next to its payload."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn
from uuid import UUID

from asgiref.sync import sync_to_async

from django_jobs import limits
from django_jobs.exceptions import Snooze


@dataclass(slots=True, eq=False)
class JobContext:
    """What a handler knows about the job it runs.

    ``key`` is the job's idempotency key: the dedupe key given at enqueue, or the
    job id. Pass it to external APIs that accept one (a payment provider's
    ``Idempotency-Key`` header, say) so that a retried attempt is recognised there.
    """

    id: UUID
    name: str
    queue: str
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    dedupe_key: str | None = None
    worker_id: str = ""
    # The alias of the job database that holds this job (docs/scaling.md).
    database: str = "default"
    # When the first attempt started, and the errors of earlier attempts (oldest first).
    started_at: datetime | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    _extend: Callable[[float], None] | None = field(default=None, repr=False)
    # Most handlers never look at the cancellation event: make it on first use.
    _event: threading.Event | None = field(default=None, repr=False)
    _cancel_requested: bool = field(default=False, repr=False)
    # Workflows: reads the parents' results (the worker hands in the store's reader);
    # called on first use of parent_results, whose answer is kept.
    _parents: Callable[[], dict[str, Any]] | None = field(default=None, repr=False)
    _parent_results: dict[str, Any] | None = field(default=None, repr=False)
    # ctx.progress(): the worker's writer of a value, the last value, and whether
    # (and when, on the monotonic clock) it was handed to the writer.
    _report: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False)
    _progress: dict[str, Any] | None = field(default=None, repr=False)
    _progress_sent: bool = field(default=True, repr=False)
    _progress_at: float = field(default=-limits.PROGRESS_INTERVAL, repr=False)

    @property
    def key(self) -> str:
        """The dedupe key given at enqueue, else the job id as text."""
        return self.dedupe_key if self.dedupe_key is not None else str(self.id)

    @property
    def parent_results(self) -> dict[str, Any]:
        """The results of the jobs this one waited for (``after``), by each one's key.

        Each parent's idempotency key (its dedupe key, or its job id as text)
        maps to the JSON result in its completion marker. Read from the database
        on first access; ``{}`` for a job without parents.
        """
        if self._parent_results is None:
            self._parent_results = {} if self._parents is None else self._parents()
        return self._parent_results

    async def aparent_results(self) -> dict[str, Any]:
        """The results of the parents, as parent_results, read without blocking the event loop.

        The read runs on the worker's threads for the ORM (``sync_to_async``); its
        answer is kept, as parent_results keeps it.
        """
        if self._parent_results is None:
            parents = self._parents
            self._parent_results = {} if parents is None else await sync_to_async(parents)()
        return self._parent_results

    @property
    def cancelled(self) -> threading.Event:
        """Set when the worker wants this attempt to stop (timeout, shutdown, lost lease)."""
        event = self._event
        if event is None:
            event = self._event = threading.Event()
            # cancel() may have run between the check above and the assignment.
            if self._cancel_requested:
                event.set()
        return event

    @property
    def is_cancelled(self) -> bool:
        """True once the worker wants this attempt to stop.

        That is on a timeout, a shutdown, a lost lease or a cancel.
        """
        return self._cancel_requested

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def cancel(self) -> None:
        """Ask the handler to stop (called by the worker)."""
        self._cancel_requested = True
        if self._event is not None:
            self._event.set()

    def snooze(self, seconds: float | timedelta) -> NoReturn:
        """Stop this attempt and run the job again after `seconds`, without counting an attempt."""
        raise Snooze(seconds)

    def progress(self, done: float, total: float | None = None, note: str = "") -> None:
        """Report how far this attempt is: `done` of `total` (None: unknown), and a note.

        Cheap enough for a tight loop: the worker writes the job's row at most
        once a second, and the last value at its next heartbeat and when the
        attempt ends, so that the job's marker or dead letter keeps it. Safe to
        call from async handlers (it never blocks). Raises ValueError for a
        negative or non-finite count, `done` above `total`, or a note that is not
        printable text of at most 200 characters.
        """
        value = limits.progress(done, total, note)
        self._progress, self._progress_sent = value, False
        now = time.monotonic()
        if now - self._progress_at >= limits.PROGRESS_INTERVAL:
            self.flush_progress(now)

    def flush_progress(self, now: float | None = None) -> None:
        """Hand the last value of progress() to the worker's writer, if not handed yet."""
        value, report = self._progress, self._report
        if self._progress_sent or value is None or report is None:
            return
        self._progress_sent = True
        self._progress_at = time.monotonic() if now is None else now
        report(value)

    def extend_lease(self, seconds: float) -> None:
        """Ask the worker to keep this job leased for at least `seconds` more."""
        seconds = limits.seconds("extend_lease", seconds)
        if self._extend is not None:
            self._extend(seconds)


@dataclass(slots=True, eq=False)
class ChunkContext:
    """What a chunk handler knows about the jobs it runs: ``jobs[i]`` is payload i's context."""

    name: str
    queue: str
    worker_id: str
    jobs: list[JobContext]

    @property
    def is_cancelled(self) -> bool:
        """Whether the worker wants any job of the chunk to stop (see JobContext.cancelled)."""
        return any(ctx.is_cancelled for ctx in self.jobs)

    def extend_lease(self, seconds: float) -> None:
        """Ask the worker to keep every job of the chunk leased for at least `seconds` more."""
        for ctx in self.jobs:
            ctx.extend_lease(seconds)
