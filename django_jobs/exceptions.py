"""Exceptions raised by django-jobs, and the ones handlers raise to steer it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from django_jobs import limits


class JobsError(Exception):
    """Base class of every error django-jobs raises."""


class InvalidJob(JobsError, ValueError):
    """An enqueue argument is invalid: nothing was written."""


class InvalidPayload(InvalidJob):
    """The payload cannot be stored as JSON, is too large, or fails the handler's validator."""


class UnknownJob(InvalidJob, LookupError):
    """No handler is registered under that name."""


class InvalidTaskArguments(InvalidPayload, TypeError):
    """A django.tasks Task was enqueued with arguments that do not survive a JSON round trip.

    A TypeError too, as Django's own backends raise for arguments they cannot store.
    """


class IdempotencyConflict(JobsError):
    """The key is already used by a job with another name or payload."""

    def __init__(self, key: str, existing_id: object) -> None:
        super().__init__(
            f"key {key!r} already belongs to job {existing_id} with a different "
            "name or payload; use a new key for different work"
        )
        self.key = key
        self.existing_id = existing_id


class HandlerConflict(JobsError):
    """Two different functions were registered under one job name."""


class FatalError(Exception):
    """Raise from a handler when retrying cannot help: the job is dead-lettered at once."""


class LeaseExpired(JobsError):
    """Recorded for an attempt whose lease expired before it settled (its worker died or hung)."""


class JobCancelled(JobsError):
    """Recorded for a job an operator cancelled before its handler started."""


class UnstorableResult(JobsError):
    """Recorded for an attempt whose return value the database cannot store.

    Not JSON, NaN or an infinity, a lone surrogate, or a NUL character: the
    attempt fails (and is retried or dead-lettered by the handler's policy)
    instead of running again silently at every lease expiry.
    """


class MalformedJob(JobsError):
    """Recorded for a job row the worker cannot use as it is (a hand-edited column)."""


class LeaseLost(JobsError):
    """This worker no longer holds the job: another worker took it over after its lease expired."""


class Snooze(Exception):  # noqa: N818 - it is an instruction, not an error
    """Raise from a handler to run the job again after `seconds`, without counting an attempt.

    ``raise Snooze(30)`` or ``ctx.snooze(30)``: the job goes back to waiting with
    its run time that far ahead (on the database clock), and its attempt is given
    back. An atomic handler's effects are rolled back, as for any exception.
    """

    MAX_SECONDS = float(limits.MAX_SECONDS)

    def __init__(self, seconds: float | timedelta = 0.0) -> None:
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        elif not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise TypeError(f"Snooze takes seconds or a timedelta, not {seconds!r}")
        value = limits.seconds("Snooze", seconds, zero=True)
        super().__init__(f"snoozed for {value:g}s")
        self.seconds = value


class ChunkFailed(Exception):  # noqa: N818 - it reports other jobs' failures, like Snooze
    """Raise from a chunk handler when some of its jobs failed and the others are done.

    ``failures`` maps each failed job, by its id (``ctx.jobs[i].id``, a UUID or its
    text) or by its index in ``payloads``, to the exception it failed with; each is
    retried (or dead-lettered) alone, following its own attempts. The other jobs
    complete, with ``results[i]`` as their result when ``results`` is given (one
    entry per payload; those of failed jobs are ignored). docs/handlers.md#chunk-handlers
    """

    def __init__(
        self, failures: Mapping[object, BaseException], results: Sequence[object] | None = None
    ) -> None:
        super().__init__(f"{len(failures)} job(s) of the chunk failed")
        self.failures = dict(failures)
        self.results = None if results is None else list(results)
