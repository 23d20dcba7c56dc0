"""The operators' admin: dead letters, live and running jobs, markers, operations, a dashboard.

Everything here is read-only. The only writes are explicit actions (replay,
run now, cancel, pause and resume, enable and disable), each gated by its own
permission, each calling a named state change of the store, each reported with
``message_user``. Payloads are shown with the ``MASK_KEYS`` masked.

Importing this package (Django's admin autodiscovery does) registers every model
admin on ``admin.site``: each module registers its own.
"""

from __future__ import annotations

from django_jobs.admin.base import (
    EXACT_COUNT_LIMIT,
    EstimatedCountPaginator,
    GuardedAdmin,
    NameQueueColumns,
    ReadOnlyAdmin,
)
from django_jobs.admin.deadletters import DeadLetterAdmin, ReplayedFilter
from django_jobs.admin.display import (
    ATTEMPT_TEXT_LIMIT,
    ATTEMPTS_SHOWN,
    CELL_LIMIT,
    DETAIL_LIMIT,
    EMPTY,
    TITLE_LIMIT,
    attempt_history,
    bounded_pre,
    cell,
    json_text,
    list_when,
    pretty_json,
    pretty_payload,
    showable,
    when,
)
from django_jobs.admin.jobs import UNKNOWN_NAME, JobAdmin, RunningJobAdmin, StateFilter, cancel_jobs
from django_jobs.admin.markers import CompletionMarkerAdmin
from django_jobs.admin.queues import QueueStateAdmin
from django_jobs.admin.schedules import ScheduleAdmin
from django_jobs.admin.workers import WorkerBeatAdmin
from django_jobs.admin.workflows import WorkflowStepAdmin

__all__ = [
    "ATTEMPTS_SHOWN",
    "ATTEMPT_TEXT_LIMIT",
    "CELL_LIMIT",
    "DETAIL_LIMIT",
    "EMPTY",
    "EXACT_COUNT_LIMIT",
    "TITLE_LIMIT",
    "UNKNOWN_NAME",
    "CompletionMarkerAdmin",
    "DeadLetterAdmin",
    "EstimatedCountPaginator",
    "GuardedAdmin",
    "JobAdmin",
    "NameQueueColumns",
    "QueueStateAdmin",
    "ReadOnlyAdmin",
    "ReplayedFilter",
    "RunningJobAdmin",
    "ScheduleAdmin",
    "StateFilter",
    "WorkerBeatAdmin",
    "WorkflowStepAdmin",
    "attempt_history",
    "bounded_pre",
    "cancel_jobs",
    "cell",
    "json_text",
    "list_when",
    "pretty_json",
    "pretty_payload",
    "showable",
    "when",
]
