"""Enqueue: writing validated jobs, with dedupe by key (docs/enqueue.md).

The enqueue API validates and builds NewJob values, then calls JobStore.insert or
insert_many; the engine writes the rows (postgres: sql.INSERT, INSERT_KEYED, COPY;
the ORM elsewhere).
"""

from __future__ import annotations

import uuid

from django.db import transaction

from django_jobs.exceptions import InvalidJob
from django_jobs.models import JobQuerySet
from django_jobs.rows import EnqueueResult, NewJob
from django_jobs.store.base import DEDUPE_ROUNDS, Holder, duplicate
from django_jobs.store.engine import engine


def insert(jobs: JobQuerySet, job: NewJob) -> EnqueueResult:
    """Write a validated job in the open transaction, or return the job that holds its key.

    A key whose work is done (a completion marker) or that a live job holds
    makes no row: the result is that job's, marked duplicate, unless its
    fingerprint differs (IdempotencyConflict). Due jobs wake listening workers
    at commit.
    """
    if job.key is None:
        return engine(jobs.db).insert_plain(jobs, job)
    for _round in range(DEDUPE_ROUNDS):
        found = _insert_keyed(jobs, job)
        if found is not None:
            if found.kind == "inserted":
                return EnqueueResult(
                    found.id, False, job.name, job.queue, found.enqueued_at, jobs.db
                )
            return duplicate(job, found.id, found.fingerprint, jobs.db)
        # The live job finished between two statements: its marker answers next round.
    raise InvalidJob(f"key {job.key!r} keeps changing hands; try again")


def insert_many(jobs: JobQuerySet, new: list[NewJob]) -> list[EnqueueResult]:
    """Write validated jobs in one transaction; results in input order.

    Jobs without a key go in at once: COPY on PostgreSQL, bulk_create in batches
    of BULK_BATCH elsewhere. Keyed jobs go one by one through insert (dedupe).
    """
    alias = jobs.db
    with transaction.atomic(using=alias):
        results: dict[uuid.UUID, EnqueueResult] = {}
        plain = [job for job in new if job.key is None]
        keyed: dict[str, NewJob] = {}
        for job in new:
            if job.key is None:
                continue
            first = keyed.setdefault(job.key, job)
            if first is not job:  # the same key twice in one call
                results[job.id] = duplicate(job, first.id, first.fingerprint, jobs.db)
        now = engine(alias).insert_many(jobs, plain, new)
        for job in plain:
            results[job.id] = EnqueueResult(job.id, False, job.name, job.queue, now, jobs.db)
        for job in keyed.values():
            results[job.id] = insert(jobs, job)
        engine(alias).notify(alias, {job.queue for job in plain if (job.run_at or now) <= now})
        return [results[job.id] for job in new]


def _insert_keyed(jobs: JobQuerySet, job: NewJob) -> Holder | None:
    """Insert a job with a key once: ("inserted", id, None, enqueued_at), or the key's
    holder as ("completed" | "live", its id, its fingerprint, None); None if it moved on."""
    found = engine(jobs.db).insert_keyed(jobs, job)
    if found is not None:
        return found
    live = jobs.filter(key=job.key).values_list("id", "fingerprint").first()
    return None if live is None else Holder("live", *live, None)
