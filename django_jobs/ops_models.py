"""Moved to ``django_jobs.fleet`` (RunningJob to ``django_jobs.models``); kept for imports."""

from django_jobs.fleet import (
    QueueState,
    QueueStateQuerySet,
    Schedule,
    ScheduleQuerySet,
    UnknownName,
    UnknownNameQuerySet,
    WorkerBeat,
    WorkerBeatQuerySet,
    unknown_name_grace,
)
from django_jobs.models import RunningJob

__all__ = [
    "QueueState",
    "QueueStateQuerySet",
    "RunningJob",
    "Schedule",
    "ScheduleQuerySet",
    "UnknownName",
    "UnknownNameQuerySet",
    "WorkerBeat",
    "WorkerBeatQuerySet",
    "unknown_name_grace",
]
