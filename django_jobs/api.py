"""Enqueue: validate a job, then write its row inside the caller's transaction.

``enqueue_on_commit`` is what views call: the job row is written in the current
transaction on the jobs database, so the job exists if and only if that
transaction commits, and no worker can see it before. It is not built on
``transaction.on_commit``: a process that died between the commit and the
callback would lose the job.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError, ProgrammingError, connections, transaction
from django.utils import timezone

from django_jobs import (
    conf,
    encryption,
    flow,
    limits,
    registry,
    routers,
    signals,
    tracing,
    uniqueness,
)
from django_jobs import payloads as codec  # enqueue_many takes a parameter named payloads
from django_jobs.exceptions import IdempotencyConflict, InvalidJob, InvalidPayload
from django_jobs.models import OnParentDead
from django_jobs.registry import Handler
from django_jobs.rows import EnqueueResult as EnqueueResult  # public: django_jobs.EnqueueResult
from django_jobs.rows import NewJob, Parent, Step, uuid7
from django_jobs.schema import migrate_command
from django_jobs.store import JobStore

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
    after: Iterable[Any] | None = None,
    on_parent_dead: str = "wait",
    tags: Iterable[str] | None = None,
    meta: dict[str, str] | None = None,
    unique_for: timedelta | None = None,
    unique_by: Iterable[str] | None = None,
    using: str | None = None,
) -> EnqueueResult:
    """Write a job now on the jobs database, inside whatever transaction is open there.

    Raises InvalidJob (or its subclasses InvalidPayload, UnknownJob) for bad
    arguments and IdempotencyConflict when `key` belongs to a job with another
    name or payload; in both cases nothing is written.

    `after`: job ids (UUID or its text), EnqueueResults or dedupe keys of jobs
    this one waits for; it runs once all have finished (docs/workflows.md).
    `on_parent_dead` ("wait" or "dead") says what it does when one of them is
    dead-lettered; "dead" without parents is refused (InvalidJob).
    `tags` (with the handler's own) and `meta` (text to text) label the job for
    the admin's and the commands' filters (docs/observability.md).
    `unique_for` and `unique_by` (the handler's when not given): at most one job
    per period (docs/enqueue.md#unique-for-a-period); a second is a duplicate.
    `using`: the job database to write on, when DJANGO_JOBS["DATABASES"] holds several
    (otherwise the one whose transaction is open, the ROUTE's or DATABASE: docs/scaling.md).
    """
    unique = _unique(unique_for, unique_by, key)
    job = prepare(
        handler, payload, key, delay, run_at, priority, queue, max_attempts, tags, meta, unique
    )
    parents = _parents(after)
    alias = routers.job_database(using, job.name, job.queue, payload)
    return _write(job, alias, parents, _mode(on_parent_dead, parents))


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
    after: Iterable[Any] | None = None,
    on_parent_dead: str = "wait",
    tags: Iterable[str] | None = None,
    meta: dict[str, str] | None = None,
    unique_for: timedelta | None = None,
    unique_by: Iterable[str] | None = None,
    using: str | None = None,
) -> EnqueueResult:
    """Enqueue a job that exists if and only if the current transaction commits.

    The row is written in the caller's transaction on the jobs database (at
    once when no transaction is open). `commit_of` ties the job to the commit
    of another database alias instead: the row is then written after that
    commit, which is NOT atomic (a crash in between loses the job). `after`
    and `on_parent_dead` as for ``enqueue``; with `commit_of`, a parent found
    nowhere is refused from this call, and the parents are looked up again
    when the row is written (one gone by then raises from the commit). `tags`
    and `meta`, `unique_for` and `unique_by` as for ``enqueue``.

    With several job databases (DJANGO_JOBS["DATABASES"]), the row goes on `using`,
    else on the one of the innermost open ``atomic`` block (so that it commits with
    the rows it belongs to), else on the ROUTE's or DATABASE (docs/scaling.md).
    A `commit_of` that is a job database is where the row goes, in that transaction.
    """
    unique = _unique(unique_for, unique_by, key)
    job = prepare(
        handler, payload, key, delay, run_at, priority, queue, max_attempts, tags, meta, unique
    )
    if commit_of is not None and using is None and commit_of in conf.databases():
        using = commit_of
    alias = routers.job_database(using, job.name, job.queue, payload)
    if commit_of is None:
        _refuse_a_transaction_elsewhere(alias)
    parents = _parents(after)
    mode = _mode(on_parent_dead, parents)
    if commit_of is None or commit_of == alias:
        return _write(job, alias, parents, mode)
    if commit_of not in connections:
        raise InvalidJob(f"commit_of names no database alias in DATABASES: {commit_of!r}")
    if parents:
        # Now, while the caller's transaction on commit_of can still roll back.
        JobStore(alias).check_parents_exist(parents)
    # The row (and its producer span) is written at that commit: the span's parent is
    # the context of this call, not whatever is current when the commit runs.
    later = partial(_write, job, alias, parents, mode, tracing.current())
    transaction.on_commit(later, using=commit_of)
    return EnqueueResult(job.id, None, job.name, job.queue, database=alias)


def _refuse_a_transaction_elsewhere(alias: str) -> None:
    """Refuse to write at once a job whose caller's transaction is on another alias.

    Written now on the jobs database (no transaction open there), the job would
    outlive a rollback of the caller's block on the other alias, which is
    what enqueue_on_commit promises it does not.
    """
    if len(connections.settings) == 1 or connections[alias].in_atomic_block:
        return
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            raise InvalidJob(
                f"enqueue_on_commit: a transaction is open on database {conn.alias!r} but "
                f"not on the jobs database {alias!r}, so the job would be written at once "
                f"and outlive a rollback of {conn.alias!r}. Pass commit_of={conn.alias!r} "
                "to write it when that transaction commits, call enqueue() to write it "
                f"now, or, if {conn.alias!r} holds job tables, list it in "
                "DJANGO_JOBS['DATABASES'] (docs/enqueue.md, docs/scaling.md)"
            )


@dataclass(frozen=True, slots=True)
class _Options:
    """Options shared by the jobs of one enqueue call, validated once."""

    handler: Handler
    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    delay: float
    tags: list[str] | None = None
    meta: dict[str, str] | None = None
    # Unique for a period: the call's, else the handler's (None: not unique).
    unique_for: timedelta | None = None
    unique_by: tuple[str, ...] | None = None


# What a call says of uniqueness (uniqueness.options): its period and keys, or None for
# "the handler's".
_Unique = tuple[timedelta | None, tuple[str, ...] | None]


def _unique(unique_for: object, unique_by: object, key: object) -> _Unique:
    if unique_for is None and unique_by is None:
        return None, None
    return uniqueness.options(unique_for, unique_by, key)


def _options(
    handler: Handler | str,
    delay: timedelta | float | None,
    run_at: datetime | None,
    priority: int | None,
    queue: str | None,
    max_attempts: int | None,
    tags: Iterable[str] | None = None,
    meta: dict[str, str] | None = None,
    unique: _Unique = (None, None),
) -> _Options:
    handler = _resolve(handler)
    unique_for, unique_by = unique
    if unique_for is None:
        unique_for, unique_by = handler.unique_for, handler.unique_by
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
        tags=_tags(handler, tags),
        meta=None if meta is None else (limits.meta(meta, error=InvalidJob) or None),
        unique_for=unique_for,
        unique_by=unique_by,
    )


def _tags(handler: Handler, tags: Iterable[str] | None) -> list[str] | None:
    """The job's tags: the handler's and the call's, or None for none (the common case)."""
    if tags is None:
        return list(handler.tags) or None
    if isinstance(tags, str) or not isinstance(tags, list | tuple | set | frozenset):
        limits.tags(tags, error=InvalidJob)  # raises: say what it takes
    return limits.tags([*handler.tags, *tags], error=InvalidJob) or None


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
    fingerprint = codec.fingerprint(handler.name, text) if key is not None else None
    plain = None
    if options.unique_for is not None:
        key, fingerprint = uniqueness.keyed(
            handler.name,
            payload,
            text,
            key,
            options.unique_for,
            options.unique_by,
            timezone.now(),
            None if handler.encrypt is None else encryption.blind,
        )
    if handler.encrypt is not None:  # after validate, partition_by and the unique key
        text = codec.encode(encryption.seal(payload, handler.encrypt))
        plain, fingerprint = (
            fingerprint,
            None if fingerprint is None else encryption.blind(fingerprint),
        )
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
        fingerprint=fingerprint,
        partition=(
            None
            if handler.partition_by is None
            else flow.partition_of(handler.name, handler.partition_by, payload)
        ),
        tags=options.tags,
        meta=options.meta,
        also_fingerprints=(
            () if handler.encrypt is None or plain is None else encryption.blind_all(plain)
        ),
    )


def prepare(
    handler: Handler | str,
    payload: Any,
    key: str | None,
    delay: timedelta | float | None,
    run_at: datetime | None,
    priority: int | None,
    queue: str | None,
    max_attempts: int | None,
    tags: Iterable[str] | None = None,
    meta: dict[str, str] | None = None,
    unique: _Unique = (None, None),
) -> NewJob:
    """Validate and encode one job as enqueue() would, without writing it (InvalidJob)."""
    options = _options(handler, delay, run_at, priority, queue, max_attempts, tags, meta, unique)
    return _item(options, payload, key)


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
    tags: Iterable[str] | None = None,
    meta: dict[str, str] | None = None,
    unique_for: timedelta | None = None,
    unique_by: Iterable[str] | None = None,
    using: str | None = None,
) -> list[EnqueueResult]:
    """Enqueue one job per payload in one round of writes (COPY on PostgreSQL).

    Same validation, dedupe and transaction semantics as ``enqueue``: the rows
    are written in the caller's transaction on the jobs database, and if any
    item is invalid or conflicts, nothing is written. `keys`, when given, holds
    one dedupe key (or None) per payload. Results come back in input order.
    `tags` and `meta`, as for ``enqueue``, label every job of the call; `unique_for`
    and `unique_by` as for ``enqueue``, per job (with `keys`, each key is unique for
    the period). `using` as for ``enqueue``; a ROUTE that spreads the payloads over
    several databases makes one write per database, all-or-nothing within each.
    """
    unique = _unique(unique_for, unique_by, None)
    if unique[1] is not None and keys is not None:
        raise InvalidJob("pass keys= or unique_by, not both: each key is the unique key itself")
    options = _options(handler, delay, run_at, priority, queue, max_attempts, tags, meta, unique)
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
    name, queue = options.handler.name, options.queue
    where = [routers.job_database(using, name, queue, payload) for payload in items]
    if len(set(where)) == 1:
        return _write_many(jobs, where[0])
    by_alias: dict[str, list[int]] = {}
    for index, alias in enumerate(where):
        by_alias.setdefault(alias, []).append(index)
    results: list[EnqueueResult | None] = [None] * len(jobs)
    for alias, indexes in by_alias.items():
        written = _write_many([jobs[i] for i in indexes], alias)
        for i, result in zip(indexes, written, strict=True):
            results[i] = result
    return [result for result in results if result is not None]


def _write_many(jobs: list[NewJob], alias: str) -> list[EnqueueResult]:
    try:
        with tracing.sending(jobs):
            results = JobStore(alias).insert_many(jobs)
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
        limits.run_time("run_at", run_at, error=InvalidJob)
        if settings.USE_TZ and timezone.is_naive(run_at):
            raise InvalidJob("run_at must be an aware datetime when USE_TZ is on")
        if timezone.is_aware(run_at):
            run_at = run_at.astimezone(UTC)
            if not settings.USE_TZ:
                run_at = timezone.make_naive(run_at)
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


def _write(
    job: NewJob,
    alias: str,
    parents: Sequence[Parent] = (),
    mode: str = "wait",
    context: Any = None,
) -> EnqueueResult:
    """Insert job (after `parents`, when given) and send job_enqueued at commit.

    `context`: the OpenTelemetry context to parent the producer span (tracing.current()
    of a call whose write comes later), else the current one.
    """
    try:
        # The queryset built directly: a manager's using() clones twice (~10 µs per enqueue).
        store = JobStore(alias)
        with tracing.sending([job], parent=context):
            result = store.insert_after(job, parents, mode) if parents else store.insert(job)
    except DatabaseError as exc:
        _explain_missing_tables(exc, alias)
        raise
    if signals.job_enqueued.receivers:
        transaction.on_commit(partial(_send_enqueued, result), using=alias)
    return result


def _parents(after: Iterable[Any] | None) -> list[Parent]:
    """Validate `after`: each item a job id (UUID or its text), an EnqueueResult or a dedupe key."""
    if after is None:
        return []
    if isinstance(after, str | bytes | EnqueueResult | uuid.UUID):
        raise InvalidJob(f"after must be a list of jobs, not one {type(after).__name__}")
    try:
        items = list(after)
    except TypeError:
        raise InvalidJob(
            f"after must be a list of job ids, EnqueueResults or keys, not {type(after).__name__}"
        ) from None
    parents = []
    for item in items:
        if isinstance(item, EnqueueResult):
            parents.append(Parent(id=item.id))
        elif isinstance(item, uuid.UUID):
            parents.append(Parent(id=item))
        elif isinstance(item, str):
            key = limits.dedupe_key(item, error=InvalidJob)
            try:
                parents.append(Parent(id=uuid.UUID(key), key=key))
            except ValueError:
                parents.append(Parent(key=key))
        else:
            raise InvalidJob(
                "after takes job ids (UUID or text), EnqueueResults or dedupe keys, "
                f"not {type(item).__name__}"
            )
    return parents


def _mode(on_parent_dead: object, parents: Sequence[object]) -> str:
    """Validate on_parent_dead for a job with these parents (those of `after`)."""
    if on_parent_dead == "wait":  # the default, checked first: every enqueue passes here
        return "wait"
    if on_parent_dead not in OnParentDead.values:
        raise InvalidJob(f'on_parent_dead must be "wait" or "dead", not {on_parent_dead!r}')
    if not parents:
        # Most likely a forgotten or emptied after=: refused rather than a job that
        # silently never dies with anything.
        raise InvalidJob(
            f'on_parent_dead="{on_parent_dead}" needs after=[...]: '
            "a job with no parents has none to die with"
        )
    return str(on_parent_dead)


class Workflow:
    """Steps enqueued together: see ``workflow()`` and docs/workflows.md."""

    def __init__(
        self,
        name: str,
        tags: Iterable[str] | None = None,
        meta: dict[str, str] | None = None,
        using: str | None = None,
    ) -> None:
        self.name = limits.workflow_name(name, error=InvalidJob)
        self.using = using
        # What every step carries besides its own (validated here, and with each step's).
        self.tags = [] if tags is None else limits.tags(tags, error=InvalidJob)
        self.meta = {} if meta is None else limits.meta(meta, error=InvalidJob)
        # One per step, in order; after the block, what was written (a keyed
        # step whose key a live or finished job holds: that job's, duplicate).
        self.results: list[EnqueueResult] = []
        self._steps: list[Step] = []
        self._ids: dict[uuid.UUID, int] = {}
        self._keys: dict[str, int] = {}
        self._first_payload: Any = None
        self._closed = False

    def __enter__(self) -> Workflow:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        closed, self._closed = self._closed, True
        if kind is None and not closed:
            self._write()

    def enqueue(
        self,
        handler: Handler | str,
        payload: Any = None,
        *,
        after: Iterable[Any] = (),
        on_parent_dead: str = "wait",
        key: str | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        delay: timedelta | float | None = None,
        run_at: datetime | None = None,
        tags: Iterable[str] | None = None,
        meta: dict[str, str] | None = None,
    ) -> EnqueueResult:
        """Validate a step now and return its result (its id made here); it is written at exit.

        `after` may name steps of this workflow (their results, ids or keys) and
        any existing job. A key given twice in one workflow makes one step: the
        second call returns the first's result, marked duplicate. A parent
        still unfinished when the step is written makes it blocked, and its
        `delay` or `run_at` then count from its release, when its last parent
        finishes: due `delay` after it, or at `run_at` if later.
        """
        if self._closed:
            raise InvalidJob(f"workflow {self.name!r} is written already: enqueue inside its block")
        if self.tags:
            own = [] if tags is None else limits.tags(tags, error=InvalidJob)
            tags = [*self.tags, *own]
        if self.meta:
            meta = {**self.meta, **({} if meta is None else limits.meta(meta, error=InvalidJob))}
        job = prepare(
            handler, payload, key, delay, run_at, priority, queue, max_attempts, tags, meta
        )
        parents: list[int | Parent] = []
        for parent in _parents(after):
            index = None if parent.id is None else self._ids.get(parent.id)
            if index is None and parent.key is not None:
                index = self._keys.get(parent.key)
            parents.append(parent if index is None else index)
        mode = _mode(on_parent_dead, parents)
        if job.key is not None and (first := self._keys.get(job.key)) is not None:
            held = self._steps[first].job
            if held.fingerprint not in (job.fingerprint, *job.also_fingerprints):
                raise IdempotencyConflict(job.key, held.id)
            return EnqueueResult(held.id, True, job.name, job.queue, database=self._alias())
        if not self._steps:
            self._first_payload = payload  # what ROUTE sees of the workflow
        self._ids[job.id] = len(self._steps)
        if job.key is not None:
            self._keys[job.key] = len(self._steps)
        self._steps.append(Step(job, parents, mode))
        result = EnqueueResult(job.id, False, job.name, job.queue, database=self._alias())
        self.results.append(result)
        return result

    def _alias(self) -> str:
        """Where the steps go, as far as a step enqueued now can tell (the write decides)."""
        return self.using or conf.database()

    def _write(self) -> None:
        if not self._steps:
            return
        first = self._steps[0].job
        alias = routers.job_database(self.using, first.name, first.queue, self._first_payload)
        try:
            with tracing.sending_workflow(self.name, self._steps):
                self.results = JobStore(alias).insert_workflow(self.name, self._steps)
        except Exception as exc:  # COPY raises psycopg's own errors, not Django's
            _explain_missing_tables(exc, alias)
            raise
        if signals.job_enqueued.receivers:
            for result in self.results:
                transaction.on_commit(partial(_send_enqueued, result), using=alias)


def workflow(
    *,
    name: str,
    tags: Iterable[str] | None = None,
    meta: dict[str, str] | None = None,
    using: str | None = None,
) -> Workflow:
    """Enqueue steps that wait for each other, written together when the block exits.

    ::

        with workflow(name=f"order-{order.pk}") as w:
            a = w.enqueue(charge, {"order": order.pk})
            w.enqueue(ship, {"order": order.pk}, after=[a])

    The steps are validated at each ``w.enqueue``; at the end of the block (if
    it raised nothing) they are written in bulk in the caller's transaction on
    the jobs database, as ``enqueue_on_commit`` writes; a block that raises
    writes nothing. Raises InvalidJob for a name that is not printable text of
    1 to 255 characters. `tags` and `meta` go on every step, besides the step's own
    (a step's meta wins for a key both give). Every step lives in one database:
    `using`, else the one enqueue would pick for the first step (docs/scaling.md).
    """
    return Workflow(name, tags, meta, using)


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
    signals.send(signals.job_enqueued, **signals.about(result), duplicate=result.duplicate)
