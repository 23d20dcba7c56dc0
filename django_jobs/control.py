"""Control: pause and resume queues, cancel jobs, replay dead letters. Called by the admin,
the commands and you.

The operator's side of the enqueue API: named operations over the store's
querysets (QueueState, Job), one layer above it, like django_jobs.api.

- A paused queue is not claimed by any worker (each refreshes the paused set once
  per poll interval); jobs already running finish normally.
- ``replay`` gives selected dead letters new jobs (docs/admin.md): the letters of a
  name no handler is registered under are left alone (``ReplayReport.unknown``).
- ``cancel_workflow`` does the same to the steps of a workflow not finished yet.
- With several job databases (DJANGO_JOBS["DATABASES"]), ``using=None`` pauses and
  resumes a queue in every one of them, and cancels a job in whichever holds it;
  ``using=ALIAS`` acts on that database alone.
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


def job_databases(using: str | None) -> tuple[str, ...]:
    """Return the job databases an operation acts on: `using` alone, or every one for None.

    Raise InvalidJob when `using` is not one of conf.databases().
    """
    aliases = conf.databases()
    if using is None:
        return aliases
    if using not in aliases:
        raise InvalidJob(
            f"using={using!r} is not a job database: DJANGO_JOBS['DATABASES'] holds "
            f"{', '.join(map(repr, aliases))}"
        )
    return (using,)


def pause(
    queues: Iterable[str], *, by: str = "", reason: str = "", using: str | None = None
) -> int:
    """Pause queues (creating their rows); return how many were running before.

    On database `using`, or on every job database when None: a queue's pause is per
    database (each database's workers read its own), and the count adds them up.
    """
    names = [registry.check_queue(q, allowlist=False) for q in queues]
    changed = 0
    for alias in job_databases(using):
        rows = QueueState.objects.using(alias)
        rows.ensure(names)
        changed += rows.filter(name__in=names).pause(by=by, reason=reason[:200])
    return changed


def resume(queues: Iterable[str], *, using: str | None = None) -> int:
    """Resume paused queues; return how many were paused (on `using`, or on every job database).

    The row of a resumed queue that no handler declares and that holds no jobs
    (in that database) goes too: it only existed for the pause.
    """
    names = [registry.check_queue(q, allowlist=False) for q in queues]
    changed = 0
    for alias in job_databases(using):
        rows = QueueState.objects.using(alias).filter(name__in=names)
        changed += rows.resume()
        rows.filter(name__in=unknown_queues(names, using=alias), paused=False).delete()
    return changed


def unknown_queues(queues: Iterable[str], *, using: str | None = None) -> list[str]:
    """Return the queues among these that no handler declares and that hold no jobs.

    No jobs in database `using`, or in any job database when None.
    """
    unused = set(queues) - registry.declared_queues()
    if not unused:
        return []
    busy: set[str] = set()
    for alias in job_databases(using):
        jobs = Job.objects.using(alias).filter(queue__in=unused)
        busy |= set(jobs.values_list("queue", flat=True))
    return sorted(unused - busy)


def paused_queues(alias: str | None = None) -> set[str]:
    """Return the names of the paused queues."""
    rows = QueueState.objects.using(alias or conf.database()).filter(paused=True)
    return set(rows.values_list("name", flat=True))


def cancel(
    job_ids: Sequence[uuid.UUID | str], *, by: str = "", using: str | None = None
) -> CancelResult:
    """Cancel jobs: dead-letter the waiting ones now, flag the running ones for their workers.

    Each job in the database that holds it (any job database when `using` is None), or
    only those of database `using`.
    """
    ids = [uuid.UUID(str(i)) for i in job_ids]
    result = CancelResult(0, 0)
    for alias in job_databases(using):
        store = JobStore(alias)
        report = store.cancel(Job.objects.filter(id__in=ids), by=by)
        requested = store.request_cancel(Job.objects.filter(id__in=report.running))
        result = _added(result, _result(report, requested))
    return result


def cancel_workflow(name: str, by: str = "", *, using: str | None = None) -> CancelResult:
    """Cancel a workflow's steps that have not finished (docs/workflows.md).

    Waiting and blocked steps are dead-lettered as cancelled now (with their
    on_parent_dead="dead" dependents, as parent_dead); running ones are flagged
    for their workers, as ``cancel`` does. In every job database that holds steps
    of that name when `using` is None, or in database `using` alone.
    """
    name = limits.workflow_name(name, error=InvalidJob)
    result = CancelResult(0, 0)
    for alias in job_databases(using):
        store = JobStore(alias)
        report = store.cancel_workflow(name, by=by)
        requested = store.request_cancel(Job.objects.filter(id__in=report.running))
        result = _added(result, _result(report, requested))
    return result


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


def _added(a: CancelResult, b: CancelResult) -> CancelResult:
    """Return the sum of two databases' results."""
    return CancelResult(
        cancelled=a.cancelled + b.cancelled,
        requested=a.requested + b.requested,
        blocked=a.blocked + b.blocked,
        scheduled=a.scheduled + b.scheduled,
    )


def _result(report: CancelReport, requested: int) -> CancelResult:
    return CancelResult(
        cancelled=len(report.cancelled),
        requested=requested,
        blocked=report.blocked,
        scheduled=report.scheduled,
    )
