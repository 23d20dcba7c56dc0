"""Enqueue: validate a job, then write its row inside the caller's transaction.

``enqueue_on_commit`` is what views call: the job row is written in the current
transaction on the jobs database, so the job exists if and only if that
transaction commits, and no worker can see it before. It is not built on
``transaction.on_commit``: a process that died between the commit and the
callback would lose the job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError, ProgrammingError, connections, transaction
from django.utils import timezone

from django_jobs import conf, flow, limits, registry, signals
from django_jobs import payloads as codec  # enqueue_many takes a parameter named payloads
from django_jobs.exceptions import InvalidJob, InvalidPayload
from django_jobs.models import EnqueueResult as EnqueueResult  # public: django_jobs.EnqueueResult
from django_jobs.models import Job, JobQuerySet, NewJob, uuid7
from django_jobs.registry import Handler
from django_jobs.schema import migrate_command

logger = logging.getLogger(__name__)


def enqueue(
    handler: Handler | str,
    payload: Any = None,
    *,
    key: str | None = None,
    delay: timedelta | float | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
) -> EnqueueResult:
    """Write a job now on the jobs database, inside whatever transaction is open there.

    Raises InvalidJob (or its subclasses InvalidPayload, UnknownJob) for bad
    arguments and IdempotencyConflict when `key` belongs to a job with another
    name or payload; in both cases nothing is written.
    """
    job = _prepare(handler, payload, key, delay, run_at, priority, queue, max_attempts)
    return _write(job, conf.database())


def enqueue_on_commit(
    handler: Handler | str,
    payload: Any = None,
    *,
    key: str | None = None,
    delay: timedelta | float | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    commit_of: str | None = None,
) -> EnqueueResult:
    """Enqueue a job that exists if and only if the current transaction commits.

    The row is written in the caller's transaction on the jobs database (at
    once when no transaction is open). `commit_of` ties the job to the commit
    of another database alias instead: the row is then written after that
    commit, which is NOT atomic (a crash in between loses the job).
    """
    job = _prepare(handler, payload, key, delay, run_at, priority, queue, max_attempts)
    alias = conf.database()
    if commit_of is None or commit_of == alias:
        return _write(job, alias)
    if commit_of not in connections:
        raise InvalidJob(f"commit_of names no database alias in DATABASES: {commit_of!r}")
    transaction.on_commit(partial(_write, job, alias), using=commit_of)
    return EnqueueResult(job.id, None, job.name, job.queue)


@dataclass(frozen=True, slots=True)
class _Options:
    """Options shared by the jobs of one enqueue call, validated once."""

    handler: Handler
    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    delay: float


def _options(
    handler: Handler | str,
    delay: timedelta | float | None,
    run_at: datetime | None,
    priority: int | None,
    queue: str | None,
    max_attempts: int | None,
) -> _Options:
    handler = _resolve(handler)
    run_at, delay_seconds = _schedule(delay, run_at)
    if queue is not None and settings.DEBUG:
        _warn_undeclared(registry.check_queue(queue))
    return _Options(
        handler=handler,
        queue=registry.check_queue(queue if queue is not None else handler.get_queue()),
        priority=registry.check_priority(priority if priority is not None else handler.priority),
        max_attempts=registry.check_max_attempts(
            max_attempts if max_attempts is not None else handler.get_max_attempts()
        ),
        run_at=run_at,
        delay=delay_seconds,
    )


_warned: set[str] = set()


def _warn_undeclared(queue: str) -> None:
    """In DEBUG, say once per queue that runjobs does not serve a queue no handler declares."""
    if queue in _warned or queue in registry.declared_queues():
        return
    _warned.add(queue)
    logger.warning(
        "queue %r: no registered handler declares it, so `runjobs` does not serve it unless "
        "started with --queue %s",
        queue,
        queue,
    )


def _item(options: _Options, payload: Any, key: str | None) -> NewJob:
    handler = options.handler
    if key is not None:
        key = check_key(key)
    if handler.validate is not None:
        try:
            handler.validate(payload)
        except (ValueError, TypeError, ValidationError) as exc:
            raise InvalidPayload(f"payload rejected by {handler.name}'s validator: {exc}") from exc
    text = codec.encode(payload)
    return NewJob(
        id=uuid7(),
        name=handler.name,
        queue=options.queue,
        payload=text,
        priority=options.priority,
        run_at=options.run_at,
        delay=options.delay,
        max_attempts=options.max_attempts,
        key=key,
        fingerprint=codec.fingerprint(handler.name, text) if key is not None else None,
        partition=(
            None
            if handler.partition_by is None
            else flow.partition_of(handler.name, handler.partition_by, payload)
        ),
    )


def _prepare(
    handler: Handler | str,
    payload: Any,
    key: str | None,
    delay: timedelta | float | None,
    run_at: datetime | None,
    priority: int | None,
    queue: str | None,
    max_attempts: int | None,
) -> NewJob:
    return _item(_options(handler, delay, run_at, priority, queue, max_attempts), payload, key)


def enqueue_many(
    handler: Handler | str,
    payloads: Iterable[Any],
    *,
    keys: Iterable[str | None] | None = None,
    delay: timedelta | float | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
) -> list[EnqueueResult]:
    """Enqueue one job per payload in one round of writes (COPY on PostgreSQL).

    Same validation, dedupe and transaction semantics as ``enqueue``: the rows
    are written in the caller's transaction on the jobs database, and if any
    item is invalid or conflicts, nothing is written. `keys`, when given, holds
    one dedupe key (or None) per payload. Results come back in input order.
    """
    options = _options(handler, delay, run_at, priority, queue, max_attempts)
    items = list(payloads)
    key_list = [None] * len(items) if keys is None else list(keys)
    if len(key_list) != len(items):
        raise InvalidJob(f"keys has {len(key_list)} entries for {len(items)} payloads")
    jobs = []
    for index, (payload, key) in enumerate(zip(items, key_list, strict=True)):
        try:
            jobs.append(_item(options, payload, key))
        except InvalidJob as exc:
            raise type(exc)(f"job {index}: {exc}") from exc
    if not jobs:
        return []
    alias = conf.database()
    try:
        results = JobQuerySet(Job, using=alias).insert_many(jobs)
    except Exception as exc:  # COPY raises psycopg's own errors, not Django's
        _explain_missing_tables(exc, alias)
        raise
    if signals.job_enqueued.receivers:
        for result in results:
            transaction.on_commit(partial(_send_enqueued, result), using=alias)
    return results


def _resolve(handler: Handler | str) -> Handler:
    if isinstance(handler, Handler):
        registered = registry.lookup(handler.name)
        if registered is None:
            raise InvalidJob(f"handler {handler.name!r} is not registered")
        return registered
    if isinstance(handler, str):
        registry.check_name(handler)
        return registry.get_handler(handler)
    raise InvalidJob(
        f"enqueue takes a @job handler or its name, not {type(handler).__name__}; "
        "decorate the function with @job"
    )


def check_key(key: object) -> str:
    """Return key if it is a valid dedupe key, else raise InvalidJob."""
    return limits.dedupe_key(key, error=InvalidJob)


def _schedule(
    delay: timedelta | float | None, run_at: datetime | None
) -> tuple[datetime | None, float]:
    if delay is not None and run_at is not None:
        raise InvalidJob("pass delay or run_at, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJob(f"run_at must be a datetime, not {type(run_at).__name__}")
        if settings.USE_TZ and timezone.is_naive(run_at):
            raise InvalidJob("run_at must be an aware datetime when USE_TZ is on")
        try:
            if timezone.is_aware(run_at):
                run_at = run_at.astimezone(UTC)
                if not settings.USE_TZ:
                    run_at = timezone.make_naive(run_at)
        except OverflowError as exc:
            raise InvalidJob(f"run_at {run_at!r} is out of range") from exc
        return run_at, 0.0
    if delay is None:
        return None, 0.0
    if isinstance(delay, timedelta):
        seconds: Any = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = delay
    else:
        raise InvalidJob(f"delay must be a timedelta or a number of seconds, not {delay!r}")
    return None, limits.seconds(
        "delay", seconds, zero=True, error=InvalidJob, hint="; pass run_at for far-off dates"
    )


def _write(job: NewJob, alias: str) -> EnqueueResult:
    try:
        # The queryset built directly: a manager's using() clones twice (~10 µs per enqueue).
        result = JobQuerySet(Job, using=alias).insert(job)
    except DatabaseError as exc:
        _explain_missing_tables(exc, alias)
        raise
    if signals.job_enqueued.receivers:
        transaction.on_commit(partial(_send_enqueued, result), using=alias)
    return result


# PostgreSQL's undefined_table and undefined_column.
_UNDEFINED = frozenset({"42P01", "42703"})


def _explain_missing_tables(exc: Exception, alias: str) -> None:
    """Re-raise a write that failed on missing job tables as an error naming the fix."""
    text = str(exc)
    if "django_jobs_" not in text:
        return
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc.__cause__, "sqlstate", None)
    if sqlstate in _UNDEFINED or "no such table" in text or "has no column" in text:
        kind = type(exc) if isinstance(exc, DatabaseError) else ProgrammingError
        raise kind(
            f"the django_jobs tables are missing or out of date on database {alias!r} "
            f"({text.strip().splitlines()[0]}): run `{migrate_command(alias)}`"
        ) from exc


def _send_enqueued(result: EnqueueResult) -> None:
    signals.job_enqueued.send(**signals.about(result), duplicate=result.duplicate)
