"""Exceptions raised by django-jobs, and the ones handlers raise to steer it."""

from __future__ import annotations


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


class LeaseLost(JobsError):
    """This worker no longer holds the job: another worker took it over after its lease expired."""
