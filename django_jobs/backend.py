"""The Tasks backend, at the path TASKS settings name: ``django_jobs.backend.JobsBackend``.

It lives in ``django_jobs.tasks.backend``; importing it here raises the same
ImportError on Django < 6.0.
"""

from django_jobs.tasks.backend import (
    OPTION_KEYS,
    POLICY_KEYS,
    JobsBackend,
    JobsTask,
    configured_aliases,
    enqueue_step,
)

__all__ = [
    "OPTION_KEYS",
    "POLICY_KEYS",
    "JobsBackend",
    "JobsTask",
    "configured_aliases",
    "enqueue_step",
]
