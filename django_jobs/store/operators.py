"""Operators' state changes: cancel, run now, ask running jobs to stop, dead-letter the
jobs of names no worker knows (the admin, the commands and control.py call these).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from functools import partial

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from django_jobs.attempts import DeadReason, error_entry, lease_expired_entry, usable_errors
from django_jobs.models import DeadLetter, Job, JobQuerySet, WorkflowStep
from django_jobs.rows import CancelReport
from django_jobs.store import workflows
from django_jobs.store.base import chunks, with_dependents
from django_jobs.store.engine import engine, retrying_deadlocks


def cancel(jobs: JobQuerySet, *, by: str = "") -> CancelReport:
    """Move the selected unleased jobs to the dead letters as `cancelled`.

    A leased (running) job is left alone: its worker would not notice, and its
    settle would find no row. Jobs move in batches, each one transaction that
    deletes the rows and writes their letters.
    """
    alias = jobs.db
    report = CancelReport()
    for chunk in chunks(list(jobs.values_list("id", flat=True)), 500):
        rows, present = retrying_deadlocks(alias, partial(_cancel_chunk, jobs, chunk, by))
        taken = {j.id for j in rows}
        report.cancelled += [j.id for j in rows]
        # As `jobs status` tells them apart, as the rows were when locked.
        now = timezone.now()
        report.blocked += sum(j.waiting_for > 0 for j in rows)
        report.scheduled += sum(j.waiting_for == 0 and j.run_at > now for j in rows)
        report.running += [i for i in chunk if i in present and i not in taken]
        report.gone += [i for i in chunk if i not in present]
    return report


def _cancel_chunk(
    jobs: JobQuerySet, chunk: list[uuid.UUID], by: str
) -> tuple[list[Job], set[uuid.UUID]]:
    """Cancel what of chunk is unleased, in one transaction; return it and what exists."""
    alias = jobs.db
    with transaction.atomic(using=alias):
        unleased = Job.objects.using(alias).filter(id__in=chunk, locked_by__isnull=True)
        # A blocked job is never being claimed: a lock on it is a settle releasing
        # it, to be waited for (after which it is blocked still, or due, and
        # cancelled either way), not skipped as running. In id order, as the
        # settle's release locks.
        rows = list(unleased.filter(waiting_for__gt=0).order_by("id").select_for_update())
        # skip_locked: a job a worker is claiming right now counts as running.
        rows += list(
            unleased.exclude(id__in=[j.id for j in rows]).select_for_update(skip_locked=True)
        )
        present = set(Job.objects.using(alias).filter(id__in=chunk).values_list("id", flat=True))
        if rows:
            engine(alias).delete_locked(
                Job.objects.using(alias).filter(id__in=[j.id for j in rows], locked_by__isnull=True)
            )
            now = timezone.now()
            DeadLetter.objects.using(alias).bulk_create(
                [_cancelled_letter(job, by, now) for job in rows]
            )
            workflows.dead_letter_dependents(jobs, with_dependents(rows))
    return rows, present


def cancel_workflow(jobs: JobQuerySet, workflow: str, *, by: str = "") -> CancelReport:
    """Cancel the live steps of a workflow as cancel() does (running ones are left alone).

    A step that died and was replayed counts by its replay's job, as the
    workflow page shows it (a replay moves the step's row to its job; this
    covers a row left at the letter's id).
    """
    steps = WorkflowStep.objects.using(jobs.db).filter(workflow=workflow).values("job_id")
    replays = DeadLetter.objects.using(jobs.db).filter(id__in=steps, replay_job_id__isnull=False)
    return cancel(jobs.filter(Q(id__in=steps) | Q(id__in=replays.values("replay_job_id"))), by=by)


def run_now(jobs: JobQuerySet) -> int:
    """Make the selected scheduled jobs due at once; return how many were moved.

    Waiting, blocked and running jobs are left alone (the claim never takes a
    job whose run-at lies ahead, so this cannot race one; a blocked workflow
    step runs when its parents have finished, not before).
    """
    alias = jobs.db
    scheduled = jobs.scheduled()
    with transaction.atomic(using=alias):
        queues = sorted(set(scheduled.values_list("queue", flat=True)))
        moved = scheduled.update(run_at=Now())
        if moved:
            engine(alias).notify(alias, queues)
    return moved


def request_cancel(jobs: JobQuerySet) -> int:
    """Flag leased jobs for cancellation; their workers see it at their next heartbeat."""
    flagged = jobs.filter(locked_by__isnull=False, cancel_requested_at__isnull=True)
    # Settles delete and release these rows meanwhile: InnoDB may pick this as a
    # deadlock's victim, and one statement is safe to run again.
    return retrying_deadlocks(jobs.db, partial(flagged.update, cancel_requested_at=Now()))


def dead_letter_unknown(
    jobs: JobQuerySet,
    name: str,
    *,
    before: datetime,
    message: str,
    worker: str = "",
    limit: int = 500,
) -> list[DeadLetter]:
    """Dead-letter as unknown_name up to `limit` claimable jobs of `name` due before `before`.

    For the upkeep, once no live worker has known the name for the grace period.
    One transaction: jobs a worker is claiming right now are skipped (SKIP
    LOCKED), and a job whose lease expired keeps the lost attempt in its errors.
    """
    alias = jobs.db
    due_before = Q(locked_by__isnull=True, run_at__lte=before) | Q(
        locked_by__isnull=False, lease_expires_at__lte=before
    )
    with transaction.atomic(using=alias):
        rows = list(
            Job.objects.using(alias)
            .claimable()
            .filter(due_before, name=name)
            .order_by()
            .select_for_update(skip_locked=True)[:limit]
        )
        if not rows:
            return []
        ids = [j.id for j in rows]
        deleted = engine(alias).delete_locked(
            Job.objects.using(alias).filter(id__in=ids).claimable()
        )
        if deleted != len(rows):  # only without row locks (SQLite): try again next round
            transaction.set_rollback(True, using=alias)
            return []
        now = timezone.now()
        letters = []
        for job in rows:
            if job.locked_by is not None:
                lost = lease_expired_entry(job.attempts, job.locked_by, now)
                job.errors = [*usable_errors(job.errors), lost]
            error = error_entry(
                job.attempts,
                kind="django_jobs.UnknownJob",
                message=message,
                worker=worker,
                at=now,
            )
            letters.append(
                DeadLetter.for_job(job, reason=DeadReason.UNKNOWN_NAME, error=error, dead_at=now)
            )
        written = DeadLetter.objects.using(alias).bulk_create(letters)
        workflows.dead_letter_dependents(jobs, with_dependents(rows))
        return written


def _cancelled_letter(job: Job, by: str, now: datetime) -> DeadLetter:
    error = error_entry(
        job.attempts,
        kind="django_jobs.Cancelled",
        message=f"cancelled by {by}" if by else "cancelled",
        at=now,
    )
    return DeadLetter.for_job(job, reason=DeadReason.CANCELLED, error=error, dead_at=now)
