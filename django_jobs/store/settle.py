"""Settle: what a worker does with a job it holds (complete, retry, snooze, release,
dead-letter), the heartbeat's lease extension and the progress it writes.

Each function is the engine-independent half; the statements are the engine's
(postgres: sql.COMPLETE, COMPLETE_ATOMIC, RELEASE, EXTEND_LEASES; the ORM's in
portable.Portable, with MariaDB's locked deletes in mysql.MySQL).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Subquery
from django.db.models.functions import Now

from django_jobs.models import CompletionMarker, DeadLetter, JobQuerySet
from django_jobs.rows import ClaimedJob, Finished, Leases, Settled
from django_jobs.store import workflows
from django_jobs.store.engine import engine

# A dead letter's payload longer than this (in characters) is copied from its job's row
# on the database server rather than sent with the letter (dead_letter() below).
LETTER_PAYLOAD_SENT = 64 * 1024


def complete(jobs: JobQuerySet, finished: Sequence[Finished]) -> Settled:
    """Settle finished jobs as done: delete each job, write its marker.

    `dependents` is the job's count as its claim returned it. Rows whose lease
    another worker holds now are left alone; the positions (in `finished`) of
    those settled are returned. The jobs waiting for those settled are released
    in the same transaction (docs/workflows.md); `woke` says whether any became due.
    """
    if not finished:
        return Settled()
    return engine(jobs.db).complete(jobs, finished)


def complete_atomically(jobs: JobQuerySet, job: ClaimedJob, result: str | None) -> bool:
    """Inside the handler's transaction: delete the job and write its marker.

    Raises LeaseLost when another worker holds the job now (the caller's
    transaction must roll back). Returns False when a marker for the key
    already exists: the work was done before, and the caller must roll back
    this attempt's effects too. The jobs waiting for it are released in the
    same transaction; job.dependents is set to the count the settle found.
    """
    if not connections[jobs.db].in_atomic_block:
        raise RuntimeError("complete_atomically must run inside transaction.atomic()")
    return engine(jobs.db).complete_atomically(jobs, job, result)


def release_dependents(jobs: JobQuerySet, keys: Sequence[str]) -> int:
    """Satisfy the open edges on parent `keys`, count their jobs down, release those at 0.

    Runs inside the transaction that writes the keys' markers (complete() and
    complete_atomically() call it). An edge is satisfied once, so a key
    released twice counts nothing twice. A released job is due now, or later
    by its own delay or run_at (models.released_run_at). Returns how many are due now
    (their queues' workers are woken at commit).
    """
    if not keys:
        return 0
    return engine(jobs.db).release_dependents(jobs, keys)


def retry(jobs: JobQuerySet, job: ClaimedJob, *, delay: float, error: dict[str, Any]) -> bool:
    """Give up the lease and make the job due again after `delay` seconds."""
    return bool(
        jobs.filter(id=job.id, locked_by=job.token).update(
            locked_by=None,
            lease_expires_at=None,
            run_at=Now() + timedelta(seconds=delay),
            errors=[*job.errors, error],
        )
    )


def release(jobs: JobQuerySet, held: Iterable[ClaimedJob]) -> int:
    """Give leases back without consuming the attempt their claim counted.

    The released jobs are due at once: their queues' listening workers are woken
    (a worker shutting down, or handing back jobs its cap holds, is not the one
    that should run them), rather than left for their next poll.
    """
    given = list(held)
    if not given:
        return 0
    released = jobs.filter(
        id__in=[j.id for j in given], locked_by__in={j.token for j in given}
    ).update(locked_by=None, lease_expires_at=None, attempts=F("attempts") - 1)
    if released:
        engine(jobs.db).notify(jobs.db, {j.queue for j in given})
    return released


def snooze(jobs: JobQuerySet, job: ClaimedJob, *, delay: float) -> bool:
    """Give up the lease, make the job due after `delay` seconds, and give back its attempt."""
    return bool(
        jobs.filter(id=job.id, locked_by=job.token).update(
            locked_by=None,
            lease_expires_at=None,
            run_at=Now() + timedelta(seconds=delay),
            attempts=F("attempts") - 1,
        )
    )


def extend_leases(jobs: JobQuerySet, held_jobs: Iterable[ClaimedJob], seconds: float) -> Leases:
    """Push the leases of jobs `seconds` ahead; say which are held and which were lost.

    A job whose row is gone because its own attempt settled it (an atomic
    handler's transaction deleted it and wrote its marker, and the worker
    has not heard yet) is neither held nor lost.
    """
    asked = list(held_jobs)
    if not asked:
        return Leases({}, frozenset())
    ids = [j.id for j in asked]
    tokens = list({j.token for j in asked})
    alias = jobs.db
    held = engine(alias).extend(jobs, ids, tokens, seconds)
    missing = [j for j in asked if j.id not in held]
    if not missing:  # the heartbeat's usual answer: one statement on PostgreSQL
        return Leases(held, frozenset())
    # Read after the statement that missed them: a row deleted by a committed
    # transaction is seen with that transaction's marker (one commit writes both).
    own = set(
        CompletionMarker.objects.using(alias)
        .filter(job_id__in=[j.id for j in missing])
        .values_list("job_id", "worker_id", "attempts")
    )
    return Leases(
        held,
        frozenset(j.id for j in missing if (j.id, j.worker_id, j.attempts) not in own),
    )


def write_progress(jobs: JobQuerySet, job: ClaimedJob, progress: dict[str, Any]) -> bool:
    """Store a held job's progress (context.JobContext.progress); False if its lease is gone."""
    written = jobs.filter(id=job.id, locked_by=job.token).update(progress=progress) > 0
    if written:
        job.progress = progress
    return written


def dead_letter(
    jobs: JobQuerySet,
    job: ClaimedJob,
    *,
    reason: str,
    error: dict[str, Any],
    attempts: int | None = None,
) -> DeadLetter | None:
    """Move a held job to the dead letters in one transaction; None if its lease is gone."""
    alias = jobs.db
    held = jobs.filter(id=job.id, locked_by=job.token)
    labels = held.values_list("tags", "meta").first()  # the claim leaves them out
    if labels is None:
        return None
    job.tags, job.meta = labels
    letter = DeadLetter.for_job(job, reason=reason, error=error, attempts=attempts)
    payload = letter.payload
    with transaction.atomic(using=alias):
        if len(payload) <= LETTER_PAYLOAD_SENT:
            if not held.delete()[0]:
                return None
            letter.save(using=alias, force_insert=True)
        else:
            # Copied from the job row on the server, not sent back: with the letter's
            # errors, a payload just under MariaDB's max_allowed_packet would make a
            # statement over it (error 1153), and the letter must always be written.
            if not list(held.select_for_update().values_list("id", flat=True)):
                return None
            letter.payload = ""
            letter.save(using=alias, force_insert=True)
            DeadLetter.objects.using(alias).filter(id=job.id).update(
                payload=Subquery(held.values("payload"))
            )
            held.delete()
            letter.payload = payload
        # The claim's count of dependents is not read under this lock: always look.
        workflows.dead_letter_dependents(jobs, {job.idempotency_key: job.id})
        return letter
