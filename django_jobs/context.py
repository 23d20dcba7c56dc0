"""The context a handler receives next to its payload."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NoReturn
from uuid import UUID

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
    key: str
    worker_id: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event)
    _extend: Callable[[float], None] | None = field(default=None, repr=False)

    @property
    def is_cancelled(self) -> bool:
        """True once the worker wants this attempt to stop (timeout, shutdown, lost lease, cancel)."""
        return self.cancelled.is_set()

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def snooze(self, seconds: float | timedelta) -> NoReturn:
        """Stop this attempt and run the job again after `seconds`, without counting an attempt."""
        raise Snooze(seconds)

    def extend_lease(self, seconds: float) -> None:
        """Ask the worker to keep this job leased for at least `seconds` more."""
        if not seconds > 0:
            raise ValueError("extend_lease needs a positive number of seconds")
        if self._extend is not None:
            self._extend(float(seconds))
