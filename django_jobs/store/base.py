"""What the store's modules share: batch sizes, a found parent, the row a new job makes.

No engine's statements here (those are in postgres.py, portable.py, mysql.py),
and no state change (those are in the concern modules).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import models

from django_jobs.exceptions import IdempotencyConflict
from django_jobs.models import DeadLetter, Dependency, Job, blocked_until
from django_jobs.rows import EnqueueResult, NewJob

# A job whose key is live or done: a few rounds cover a job finishing mid-enqueue.
DEDUPE_ROUNDS = 5
# Rows per INSERT of enqueue_many without PostgreSQL's COPY (SQLite lowers it to
# what its limit of variables per statement allows).
BULK_BATCH = 500

# Dependency and WorkflowStep rows per INSERT of a workflow (a few statements for 10,000 steps).
EDGE_BATCH = 5000

# Parents per existence check (three IN lists of this many: under SQLite's and
# PostgreSQL's limits on parameters per statement).
EXISTS_BATCH = 5000


class KeyRaced(Exception):
    """A key a replay chunk found free was taken, or completed, before its insert."""


LIVE, DONE, DEAD = "live", "done", "dead"


@dataclass(frozen=True, slots=True)
class Found:
    """A parent as found: live (its dependents counted), done (a marker) or dead (a letter)."""

    state: str
    key: str  # its idempotency key: the edge's parent_key
    id: uuid.UUID


class Holder(NamedTuple):
    """What a keyed insert found: its own row ("inserted", with the time written) or the
    job that holds its key ("completed": a marker; "live": a live job), with its fingerprint."""

    kind: str
    id: uuid.UUID
    fingerprint: str | None
    enqueued_at: datetime | None


@dataclass(slots=True)
class WorkflowRows:
    """What a workflow's insert writes in bulk after its keyed steps (the engine's
    write_workflow): unkeyed steps, edges, step rows; and the letters of steps born dead."""

    workflow: str
    plain: list[NewJob]
    edges: list[tuple[uuid.UUID, Found, str]]
    written: list[NewJob]  # the steps with a row or a letter
    now: datetime
    letters: list[DeadLetter] = field(default_factory=list)


def chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def json_loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def json_text(value: list[str] | dict[str, str] | None) -> str | None:
    """A job's tags or meta as the JSON text raw SQL sends for its column; None for none."""
    return None if value is None else json.dumps(value)


def new_row(job: NewJob, now: datetime) -> Job:
    return Job(
        id=job.id,
        name=job.name,
        queue=job.queue,
        payload=job.payload,
        priority=job.priority,
        run_at=job.run_at or now + timedelta(seconds=job.delay),
        enqueued_at=now,
        attempts=0,
        max_attempts=job.max_attempts,
        key=job.key,
        fingerprint=job.fingerprint,
        errors=[],
        partition=job.partition,
        waiting_for=job.waiting_for,
        dependents=job.dependents,
        release_delay=job.release_delay,
        not_before=job.not_before,
        trace_context=job.trace_context,
        tags=job.tags,
        meta=job.meta,
    )


def duplicate(
    job: NewJob, existing_id: uuid.UUID, fingerprint: str | None, alias: str
) -> EnqueueResult:
    if fingerprint not in (None, job.fingerprint, *job.also_fingerprints):
        raise IdempotencyConflict(job.key or "", existing_id)
    return EnqueueResult(existing_id, True, job.name, job.queue, database=alias)


def block(job: NewJob) -> NewJob:
    """Return job as written blocked: never due until its release, which applies its own
    delay (as release_delay) or run_at (as not_before) then (docs/workflows.md)."""
    delay = timedelta(seconds=job.delay) if job.run_at is None and job.delay else None
    return replace(
        job, run_at=blocked_until(), delay=0.0, release_delay=delay, not_before=job.run_at
    )


def release_timing(job: NewJob) -> dict[str, Any]:
    """The release_delay and not_before of a blocked job that has them, as update() fields."""
    timing = {"release_delay": job.release_delay, "not_before": job.not_before}
    return {name: value for name, value in timing.items() if value is not None}


def edge(job_id: uuid.UUID, parent: Found, on_parent_dead: str, now: datetime) -> Dependency:
    return Dependency(
        job_id=job_id,
        parent_key=parent.key,
        parent_id=parent.id,
        on_parent_dead=on_parent_dead,
        created_at=now,
        satisfied_at=now if parent.state == DONE else None,
    )


def with_dependents(rows: Iterable[Job]) -> dict[str, uuid.UUID]:
    """The idempotency keys (-> ids) of jobs read under lock that have dependents."""
    return {
        job.key if job.key is not None else str(job.id): job.id for job in rows if job.dependents
    }


class ById(models.Expression):
    """CASE column WHEN id THEN value ... END, its pairs as parameters: one UPDATE gives
    each row its own value (a When() per row costs the ORM a resolve each, more than
    the statement itself)."""

    def __init__(
        self, column: str, values: Mapping[uuid.UUID, Any], output_field: models.Field[Any, Any]
    ) -> None:
        super().__init__(output_field=output_field)
        self.column = column
        self.values = values

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        key_field = compiler.query.model._meta.get_field(self.column)
        params: list[Any] = []
        for row_id, value in self.values.items():
            params.append(key_field.get_db_prep_value(row_id, connection))
            params.append(self.output_field.get_db_prep_value(value, connection))
        column = connection.ops.quote_name(key_field.column)
        return f"CASE {column}{' WHEN %s THEN %s' * len(self.values)} END", tuple(params)
