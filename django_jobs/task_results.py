"""Moved to ``django_jobs.tasks.results``."""

from django_jobs.tasks.results import (
    envelope,
    fit,
    for_row,
    lookup,
    registered_task,
    task_error,
    workers_of,
)

__all__ = [
    "envelope",
    "fit",
    "for_row",
    "lookup",
    "registered_task",
    "task_error",
    "workers_of",
]
