"""django-jobs: durable background jobs kept in your Django database.

Example::

    from django_jobs import job, enqueue_on_commit

    @job(max_attempts=5)
    def send_welcome(payload, ctx):
        ...

    enqueue_on_commit(send_welcome, {"user_id": user.pk})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_jobs.context import ChunkContext, JobContext
from django_jobs.exceptions import (
    ChunkFailed,
    FatalError,
    IdempotencyConflict,
    InvalidJob,
    InvalidPayload,
    InvalidTaskArguments,
    JobsError,
    Snooze,
    UnknownJob,
    UnstorableResult,
)
from django_jobs.registry import Backoff, job
from django_jobs.schedules import periodic

if TYPE_CHECKING:
    from django_jobs.api import (
        EnqueueResult,
        enqueue,
        enqueue_many,
        enqueue_on_commit,
        workflow,
    )
    from django_jobs.control import cancel_workflow
    from django_jobs.models import OnParentDead

__version__ = "0.1.0"

__all__ = [
    "Backoff",
    "ChunkContext",
    "ChunkFailed",
    "EnqueueResult",
    "FatalError",
    "IdempotencyConflict",
    "InvalidJob",
    "InvalidPayload",
    "InvalidTaskArguments",
    "JobContext",
    "JobsError",
    "OnParentDead",
    "Snooze",
    "UnknownJob",
    "UnstorableResult",
    "cancel_workflow",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "job",
    "periodic",
    "workflow",
]

# These import the models, which need the app registry: load them on first use.
_LAZY = {
    "enqueue": "api",
    "enqueue_many": "api",
    "enqueue_on_commit": "api",
    "EnqueueResult": "api",
    "workflow": "api",
    "cancel_workflow": "control",
    "OnParentDead": "models",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from django.apps import apps

        if apps.ready and not apps.is_installed("django_jobs"):
            # Rather than Django's "Model class ... isn't in an application in INSTALLED_APPS".
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                "'django_jobs' is not in INSTALLED_APPS: add it (and 'rangefilter' for the "
                "admin), then run `python manage.py migrate`"
            )
        from django_jobs import api, control, models

        module = {"api": api, "control": control, "models": models}[_LAZY[name]]
        return getattr(module, name)
    raise AttributeError(f"module 'django_jobs' has no attribute {name!r}")
