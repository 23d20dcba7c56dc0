"""Control: pause and resume queues, cancel jobs, replay dead letters. Called by the admin,
the commands and you.

The operator's side of the enqueue API: named operations over the store's
querysets (QueueState, Job), one layer above it, like django_jobs.api.

- A paused queue is not claimed by any worker (each refreshes the paused set once
  per poll interval); jobs already running finish normally.
- ``replay`` gives selected dead letters new jobs (docs/admin.md): the letters of a
  name no handler is registered under are left alone (``ReplayReport.unknown``).
- ``cancel_workflow`` does the same to the steps of a workflow not finished yet.
- Cancelling a job no worker holds moves it to the dead letters at once
  (``reason="cancelled"``). Cancelling a running job flags it; its worker sees the
  flag at its next heartbeat and sets the handler's ``ctx.cancelled``. If the
  handler then stops (raises, times out or snoozes), the job goes to the dead
  letters as ``cancelled`` instead of being retried; if it returns normally, its
  work is done and it completes as usual.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django_jobs import conf, limits, registry
from django_jobs.exceptions import InvalidJob
from django_jobs.models import DeadLetterQuerySet, Job, QueueState
from django_jobs.rows import CancelReport, ReplayReport
from django_jobs.store import JobStore
from django_jobs.store.replay import replay_request


@dataclass(frozen=True, slots=True)
class CancelResult:
    cancelled: int  # jobs not running (due, scheduled or blocked) moved to the dead letters now
    requested: int  # running jobs flagged; their workers stop them at the next heartbeat
    blocked: int = 0  # of the cancelled: workflow steps that waited for their parents
    scheduled: int = 0  # of the cancelled: due later; the others were due (waiting)

    @property
    def waiting(self) -> int:
        """Of the cancelled, the jobs that were due."""
        return self.cancelled - self.blocked - self.scheduled


def pause(
    queues: Iterable[str], *, by: str = "", reason: str = "", using: str | None = None
) -> int:
    """Pause queues (creating their rows); return how many were running before.

    `using`: the job database whose workers stop claiming them (default DATABASE).
    """
    names = [registry.check_queue(q, allowlist=False) for q in queues]
    rows = QueueState.objects.using(using or conf.database())
    rows.ensure(names)
    return rows.filter(name__in=names).pause(by=by, reason=reason[:200])


def resume(queues: Iterable[str], *, using: str | None = None) -> int:
    """Resume paused queues (of job database `using`, default DATABASE); return how many
    were paused.

    The row of a resumed queue that no handler declares and that holds no jobs
    goes too: it only existed for the pause.
    """
    alias = using or conf.database()
    names = [registry.check_queue(q, allowlist=False) for q in queues]
    rows = QueueState.objects.using(alias).filter(name__in=names)
    changed = rows.resume()
    rows.filter(name__in=unknown_queues(names, using=alias), paused=False).delete()
    return changed


def unknown_queues(queues: Iterable[str], *, using: str | None = None) -> list[str]:
    """Return the queues among these that no handler declares and that hold no jobs
    (on job database `using`, default DATABASE)."""
    unused = set(queues) - registry.declared_queues()
    if not unused:
        return []
    alias = using or conf.database()
    busy = set(Job.objects.using(alias).filter(queue__in=unused).values_list("queue", flat=True))
    return sorted(unused - busy)


def paused_queues(alias: str | None = None) -> set[str]:
    """Return the names of the paused queues."""
    rows = QueueState.objects.using(alias or conf.database()).filter(paused=True)
    return set(rows.values_list("name", flat=True))


def cancel(job_ids: Sequence[uuid.UUID | str], *, by: str = "") -> CancelResult:
    """Cancel jobs: dead-letter the waiting ones now, flag the running ones for their workers."""
    ids = [uuid.UUID(str(i)) for i in job_ids]
    store = JobStore(conf.database())
    report = store.cancel(Job.objects.filter(id__in=ids), by=by)
    requested = store.request_cancel(Job.objects.filter(id__in=report.running))
    return _result(report, requested)


def cancel_workflow(name: str, by: str = "") -> CancelResult:
    """Cancel a workflow's steps that have not finished (docs/workflows.md).

    Waiting and blocked steps are dead-lettered as cancelled now (with their
    on_parent_dead="dead" dependents, as parent_dead); running ones are flagged
    for their workers, as ``cancel`` does.
    """
    name = limits.workflow_name(name, error=InvalidJob)
    store = JobStore(conf.database())
    report = store.cancel_workflow(name, by=by)
    requested = store.request_cancel(Job.objects.filter(id__in=report.running))
    return _result(report, requested)


def replay(
    letters: DeadLetterQuerySet,
    *,
    by: str = "",
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Give each selected letter one new live job: same name, payload, queue, priority, key.

    The new job starts with no attempts, due now (or at `run_at`, or `delay`
    from now on the database clock). The letter records when, by whom, and the
    new job's id; a letter already replayed (now, or by a concurrent call) is
    left alone, so replaying twice never makes a second job. A letter whose key
    a live job holds, whose key's work has completed since, or whose name no
    handler is registered under, is not replayed (the report says which).
    `progress(done, total)` is called after each batch of letters.
    """
    handlers = {name: h.partition_by for name, h in registry.all_handlers().items()}
    request = replay_request(
        by=by, run_at=run_at, delay=delay, partition_by=handlers, progress=progress
    )
    return JobStore(letters.db).replay(letters, request)


def _result(report: CancelReport, requested: int) -> CancelResult:
    return CancelResult(
        cancelled=len(report.cancelled),
        requested=requested,
        blocked=report.blocked,
        scheduled=report.scheduled,
    )
