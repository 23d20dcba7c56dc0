"""Live jobs, completion markers and dead letters, and every state change between them.

Each table has one job: ``Job`` holds live work only (waiting, scheduled or
leased), ``CompletionMarker`` one row per finished unit of work (keyed by its
idempotency key), ``DeadLetter`` the jobs that will not run again unless
replayed. Finishing or dead-lettering a job deletes its row in the same
transaction that writes the marker or the letter, so the hot table stays small.

Every insert, settle and notify of a job row goes through the named methods of
``JobQuerySet`` below (the enqueue API validates, then calls ``insert``; a replay
inserts the same way). PostgreSQL runs the hot ones (insert, claim, complete,
extend) as single statements from ``sql.py``; other databases use the ORM
equivalents next to them. The fleet's tables (queues, workers, schedules) live in
``fleet.py``, which imports nothing of these.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, NamedTuple, cast

from django.conf import settings
from django.core.checks import CheckMessage
from django.core.exceptions import EmptyResultSet
from django.db import IntegrityError, OperationalError, connections, models, transaction
from django.db.models import Case, Exists, ExpressionWrapper, F, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce, Greatest, Now
from django.db.models.sql import DeleteQuery
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_jobs import conf, flow, limits, registry, sql, tracing
from django_jobs.attempts import (  # noqa: F401 - LEASE_EXPIRED and MAX_TRACEBACK re-exported
    LEASE_EXPIRED,
    MAX_LABEL,
    MAX_MESSAGE,
    MAX_TRACEBACK,
    error_entry,
    error_summary,
    lease_expired_entry,
    usable_errors,
    worker_of,
)
from django_jobs.exceptions import IdempotencyConflict, InvalidJob, InvalidPayload, LeaseLost

# Re-exported (X as X): Django finds Schedule and UnknownName here, and imports use them all.
from django_jobs.fleet import QueueState as QueueState
from django_jobs.fleet import Schedule as Schedule
from django_jobs.fleet import UnknownName as UnknownName
from django_jobs.fleet import WorkerBeat as WorkerBeat
from django_jobs.limits import (
    FINGERPRINT_LENGTH,
    MAX_BY_LENGTH,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_PRIORITY,
    MAX_QUEUE_LENGTH,
    MAX_TOKEN_LENGTH,
    MAX_TRACE_CONTEXT_LENGTH,
    MIN_PRIORITY,
)
from django_jobs.managers import JobsDatabaseManager
from django_jobs.payloads import fingerprint as payload_fingerprint
from django_jobs.payloads import safe_str, storable_text


def uuid7() -> uuid.UUID:
    """Return a time-ordered UUID (RFC 9562 version 7): ids sort roughly by creation."""
    ms = time.time_ns() // 1_000_000
    # Ids must be unique, not secret: the module PRNG (seeded from os.urandom and
    # reseeded in forked children) is 20x cheaper than a syscall per id.
    rand = random.getrandbits(80)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | rand
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # RFC 4122 variant
    return uuid.UUID(int=value)


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _is_postgres(alias: str) -> bool:
    return connections[alias].vendor == "postgresql"


# Django's warnings that a database has no partial indexes. On MySQL and MariaDB,
# migration 0004 adds the plain unique index that keeps keys unique, and the
# conditional indexes are made without their condition (they still serve the claim).
_PARTIAL_INDEX_WARNINGS = {"models.W036", "models.W037"}


def _covered_partial_index_warnings(
    errors: list[CheckMessage], databases: Iterable[str] | None
) -> list[CheckMessage]:
    """Drop W036/W037 when the only databases lacking partial indexes are MySQL or MariaDB."""
    lacking = {
        connections[alias].vendor
        for alias in databases or ()
        if not connections[alias].features.supports_partial_indexes
    }
    if not lacking <= {"mysql"}:
        return errors
    return [e for e in errors if e.id not in _PARTIAL_INDEX_WARNINGS]


class DeadReason(models.TextChoices):
    INVALID_PAYLOAD = "invalid_payload", _("invalid payload")
    UNKNOWN_NAME = "unknown_name", _("unknown name")
    ATTEMPTS_EXHAUSTED = "attempts_exhausted", _("attempts exhausted")
    FATAL = "fatal", _("fatal error")
    CANCELLED = "cancelled", _("cancelled")
    # A workflow step whose parent died, when the step asked for on_parent_dead="dead".
    PARENT_DEAD = "parent_dead", _("parent dead")
    # A hand-edited column the worker cannot use, or a row the database refused to update.
    MALFORMED = "malformed", _("malformed row")


class JobState(models.TextChoices):
    """What an operator sees of a live job, derived from its run-at and lease."""

    WAITING = "waiting", _("waiting")  # due: not leased, or its lease expired (rescue is due)
    SCHEDULED = "scheduled", _("scheduled")  # not due yet (delayed, or retrying after backoff)
    RUNNING = "running", _("running")  # leased to a worker, and the lease is live
    BLOCKED = "blocked", _("blocked")  # a workflow step waiting for its parents to finish


# JobState as conditions on the database clock `now`, for filters, counts and
# annotations alike, and the one definition of "running" (the admin's, jobs
# status', flow control's and the Tasks API's): a leased job whose lease is live. A
# job whose lease expired is waiting: nobody holds it any more, and the next claim
# takes it over first (the admin says a rescue is due).
# The run_at of a blocked workflow step (docs/workflows.md): never due, so no
# claim needs a condition of its own; its last parent's settle sets it to now.
BLOCKED_UNTIL = datetime(9000, 1, 1, tzinfo=UTC)


def _released_run_at() -> Greatest:
    """The run_at of a blocked job its last parent releases, on the database clock: its
    release_delay from now, and not before its not_before (as sql._release sets it)."""
    # Coalesce: MySQL's GREATEST and SQLite's MAX are NULL when an argument is.
    return Greatest(
        Now() + Coalesce(F("release_delay"), Value(timedelta(0))),
        Coalesce(F("not_before"), Now()),
    )


def _waiting(now: Any) -> Q:
    return Q(locked_by__isnull=True, run_at__lte=now) | _lease_expired(now)


def _scheduled(now: Any) -> Q:
    return Q(locked_by__isnull=True, run_at__gt=now, waiting_for__lte=0)


def _blocked(now: Any) -> Q:
    # Not due as well: a step its last parent released (run_at now) is waiting, as
    # the claim sees it, even before its count is read back.
    return Q(locked_by__isnull=True, run_at__gt=now, waiting_for__gt=0)


_LEASED = Q(locked_by__isnull=False)


def _running_now(now: Any) -> Q:
    return _LEASED & Q(lease_expires_at__gt=now)


def _lease_expired(now: Any) -> Q:
    return _LEASED & Q(lease_expires_at__lt=now)


@dataclass(frozen=True, slots=True)
class Beat:
    """What a claim writes to the worker's heartbeat row (see WorkerBeat)."""

    worker: str
    running: int
    stats: str | None = None  # JSON text of the worker's counters, or None to keep them


@dataclass(slots=True)
class ClaimedJob:
    """A job row as a worker holds it between claim and settle."""

    id: uuid.UUID
    name: str
    queue: str
    payload: str
    priority: int
    attempts: int
    max_attempts: int
    key: str | None
    fingerprint: str | None
    enqueued_at: datetime
    started_at: datetime | None
    errors: list[dict[str, Any]]
    token: str
    completed: bool = False  # a completion marker for its key already exists
    dependents: int = 0  # jobs waiting for it, as claimed (the settle's fence, sql.COMPLETE)
    extra: dict[str, Any] = field(default_factory=dict)
    # Tracing (django_jobs.tracing): when it was due, and its producer's W3C context.
    run_at: datetime | None = None
    trace_context: str | None = None
    # The last progress the worker wrote to its row (context.JobContext.progress).
    progress: dict[str, Any] | None = None
    tags: list[str] | None = None
    meta: dict[str, str] | None = None

    @property
    def idempotency_key(self) -> str:
        return self.key if self.key is not None else str(self.id)

    @property
    def worker_id(self) -> str:
        return worker_of(self.token)

    def malformed(self) -> str | None:
        """Say which column of this row no worker can use as it is, or None when all are fine."""
        errors = self.errors
        if not isinstance(errors, list) or not all(type(e) is dict for e in errors):
            return f"its errors column is not a list of error objects: {_preview(errors)}"
        for name in ("attempts", "max_attempts", "priority"):
            if type(getattr(self, name)) is not int:
                return f"its {name} column is not an integer: {_preview(getattr(self, name))}"
        for name in ("name", "queue", "payload"):
            if type(getattr(self, name)) is not str:
                return f"its {name} column is not text: {_preview(getattr(self, name))}"
        return None

    def make_storable(self) -> None:
        """Replace what malformed() finds with usable values, so that a letter can be written."""
        self.errors = usable_errors(self.errors)
        for name, default in (("attempts", 0), ("max_attempts", 1), ("priority", 0)):
            if type(getattr(self, name)) is not int:
                setattr(self, name, default)
        for name in ("name", "queue", "payload"):
            if type(getattr(self, name)) is not str:
                setattr(self, name, storable_text(_preview(getattr(self, name))))


def _preview(value: Any) -> str:
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001 - whatever a row decodes to, describe it
        text = safe_str(type(value))
    return storable_text(text, 200)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """What enqueue did: the job's id, and whether an existing job already had its key.

    ``duplicate`` is None only for ``enqueue_on_commit(..., commit_of=other_alias)``,
    whose row is written after that other database commits. ``enqueued_at`` is the
    time written in the new row (the database's on PostgreSQL); None when no row
    was written yet, or for a duplicate.
    """

    id: uuid.UUID
    duplicate: bool | None
    name: str
    queue: str
    enqueued_at: datetime | None = None


@dataclass(slots=True)  # not frozen: frozen dataclasses cost a setattr call per field
class NewJob:
    """A validated job row to insert (the enqueue API builds it, JobQuerySet.insert writes it)."""

    id: uuid.UUID
    name: str
    queue: str
    payload: str
    priority: int
    run_at: datetime | None  # None: `delay` seconds from now, on the database clock
    delay: float
    max_attempts: int
    key: str | None
    fingerprint: str | None
    partition: str | None = None  # flow control's partition value (registry.Handler.partition_by)
    # Workflows: parents not finished yet (run_at is then BLOCKED_UNTIL), and the
    # dependents registered on it before it is written (the steps of one workflow).
    waiting_for: int = 0
    dependents: int = 0
    # A blocked job's own timing, kept for its release (see _block): due that long
    # after its last parent finishes, and not before that time.
    release_delay: timedelta | None = None
    not_before: datetime | None = None
    # The W3C context of its producer span (django_jobs.tracing), None untraced.
    trace_context: str | None = None
    # Labels to filter by (limits.tags, limits.meta); None for none.
    tags: list[str] | None = None
    meta: dict[str, str] | None = None


# What a job is, apart from its runs: its dead letter keeps these, a replay gives them back.
DEFINITION = (
    "name",
    "queue",
    "payload",
    "priority",
    "max_attempts",
    "key",
    "fingerprint",
    "trace_context",
    "tags",
    "meta",
)


def definition(job: Any) -> dict[str, Any]:
    """Return the DEFINITION fields of a job, a claimed job or a dead letter, by name."""
    return {field: getattr(job, field) for field in DEFINITION}


def _write_beat(alias: str, beat: Beat) -> None:
    """Refresh the worker's heartbeat row the ORM way (sql.CLAIM does it inside the claim)."""
    WorkerBeat.objects.using(alias).filter(id=beat.worker).update(
        last_seen_at=Now(),
        running=beat.running,
        **({"stats": json.loads(beat.stats)} if beat.stats else {}),
    )


# A job whose key is live or done: a few rounds cover a job finishing mid-enqueue.
DEDUPE_ROUNDS = 5
# Rows per INSERT of enqueue_many without PostgreSQL's COPY (SQLite lowers it to
# what its limit of variables per statement allows).
BULK_BATCH = 500
# MySQL and MariaDB refuse a statement longer than the server's max_allowed_packet
# (error 1153, and drop the connection). What an INSERT of jobs adds to their payloads,
# at most: per row (names, key, dates, the other columns escaped) and per statement.
ROW_OVERHEAD = 4096
STATEMENT_OVERHEAD = 4096


def _refuse_oversized(alias: str, jobs: Sequence[NewJob]) -> None:
    """On MySQL and MariaDB, raise InvalidPayload for a payload whose INSERT would be
    longer than the server's max_allowed_packet (before anything is written)."""
    if connections[alias].vendor != "mysql":
        return
    for index, job in enumerate(jobs):
        # At most 4 bytes a character, in UTF-8 or escaped: a payload this short fits.
        if 4 * len(job.payload) + ROW_OVERHEAD + STATEMENT_OVERHEAD <= _SMALLEST_PACKET:
            continue
        packet = _max_packet(alias)
        room = packet - ROW_OVERHEAD - STATEMENT_OVERHEAD
        if (size := _sent_size(job.payload)) > room:
            raise InvalidPayload(
                f"{f'job {index}: ' if len(jobs) > 1 else ''}payload is {size} bytes as "
                f"sent to the database; its INSERT would be longer than the server's "
                f"max_allowed_packet ({packet} bytes), which leaves room for {room}; "
                "store large data elsewhere and pass its id"
            )


def _packet_batches(alias: str, jobs: list[NewJob]) -> list[list[NewJob]]:
    """Split jobs into bulk_create batches of BULK_BATCH rows, on MySQL and MariaDB
    also each shorter than max_allowed_packet (each job checked by _refuse_oversized)."""
    batches = [jobs[i : i + BULK_BATCH] for i in range(0, len(jobs), BULK_BATCH)]
    if connections[alias].vendor != "mysql":
        return batches
    sizes = [_sent_size(job.payload) + ROW_OVERHEAD for job in jobs]
    if sum(sizes) + STATEMENT_OVERHEAD <= _SMALLEST_PACKET:
        return batches
    room = _max_packet(alias) - STATEMENT_OVERHEAD
    batches, used = [], room  # the first job starts a batch
    for job, size in zip(jobs, sizes, strict=True):
        if used + size > room or len(batches[-1]) >= BULK_BATCH:
            batches.append([])
            used = 0
        batches[-1].append(job)
        used += size
    return batches


# Statements this small need no look at max_allowed_packet (MySQL's and MariaDB's
# defaults are 64 MiB and 16 MiB; 1 MiB is MySQL 5.5's).
_SMALLEST_PACKET = 1024 * 1024


def _sent_size(payload: str) -> int:
    """Return the bytes payload takes in a MySQL statement: UTF-8, quotes and \\ escaped."""
    return len(payload.encode()) + payload.count('"') + payload.count("\\") + payload.count("'")


def _max_packet(alias: str) -> int:
    """Return the server's max_allowed_packet, read once per connection."""
    conn = connections[alias]
    conn.ensure_connection()
    cached = getattr(conn, "_django_jobs_max_packet", None)
    if cached is None or cached[0] is not conn.connection:
        with conn.cursor() as cursor:
            cursor.execute(sql.MAX_ALLOWED_PACKET)
            cached = (conn.connection, int(cursor.fetchone()[0]))
        setattr(conn, "_django_jobs_max_packet", cached)  # noqa: B010 - not a wrapper field
    return int(cached[1])


_CLAIMED_FIELDS = (
    "id",
    "name",
    "queue",
    "payload",
    "priority",
    "attempts",
    "max_attempts",
    "key",
    "fingerprint",
    "enqueued_at",
    "started_at",
    "errors",
    "dependents",
    "run_at",
    "trace_context",
    "tags",
    "meta",
)


class _KeyCompleted(Exception):
    """Rolls back an insert whose key's marker appeared meanwhile (JobQuerySet._insert_keyed)."""

    def __init__(self, marker: tuple[uuid.UUID, str | None]) -> None:
        self.marker = marker


class _KeyRaced(Exception):
    """A key a replay chunk found free was taken, or completed, before its insert."""


class _ReplayCycles(Exception):
    """Letters of a replay chunk whose jobs would wait for their own waiters (_refuse_cycle)."""

    def __init__(self, letters: set[uuid.UUID]) -> None:
        super().__init__(letters)
        self.letters = letters


class JobQuerySet(models.QuerySet["Job"]):
    """Named state changes of live jobs: every insert, settle and notify of a job row."""

    # ---- enqueue ----------------------------------------------------------

    def insert(self, job: NewJob) -> EnqueueResult:
        """Write a validated job in the open transaction, or return the job that holds its key.

        A key whose work is done (a completion marker) or that a live job holds
        makes no row: the result is that job's, marked duplicate, unless its
        fingerprint differs (IdempotencyConflict). Due jobs wake listening workers
        at commit.
        """
        if job.key is None:
            return self._insert_plain(job)
        for _round in range(DEDUPE_ROUNDS):
            found = self._insert_keyed(job)
            if found is not None:
                kind, job_id, fingerprint, enqueued_at = found
                if kind == "inserted":
                    return EnqueueResult(job_id, False, job.name, job.queue, enqueued_at)
                return _duplicate(job, job_id, fingerprint)
            # The live job finished between two statements: its marker answers next round.
        raise InvalidJob(f"key {job.key!r} keeps changing hands; try again")

    def insert_many(self, jobs: list[NewJob]) -> list[EnqueueResult]:
        """Write validated jobs in one transaction; results in input order.

        Jobs without a key go in at once: COPY on PostgreSQL, bulk_create in batches
        of BULK_BATCH elsewhere. Keyed jobs go one by one through insert (dedupe).
        """
        alias = self.db
        with transaction.atomic(using=alias):
            results: dict[uuid.UUID, EnqueueResult] = {}
            plain = [job for job in jobs if job.key is None]
            keyed: dict[str, NewJob] = {}
            for job in jobs:
                if job.key is None:
                    continue
                first = keyed.setdefault(job.key, job)
                if first is not job:  # the same key twice in one call
                    results[job.id] = _duplicate(job, first.id, first.fingerprint)
            if _is_postgres(alias):
                now = sql.run(alias, "SELECT statement_timestamp()")[0][0]
                if plain:
                    with (
                        connections[alias].cursor() as cursor,
                        cursor.cursor.copy(sql.COPY_JOBS) as copy,
                    ):
                        copy.write(_copy_rows(plain, now))
            else:
                now = timezone.now()
                _refuse_oversized(alias, jobs)
                for batch in _packet_batches(alias, plain):
                    self.bulk_create([_new_row(job, now) for job in batch])
            for job in plain:
                results[job.id] = EnqueueResult(job.id, False, job.name, job.queue, now)
            for job in keyed.values():
                results[job.id] = self.insert(job)
            notify(alias, {job.queue for job in plain if (job.run_at or now) <= now})
            return [results[job.id] for job in jobs]

    def _insert_plain(self, job: NewJob) -> EnqueueResult:
        alias = self.db
        if _is_postgres(alias):
            [(_notified, enqueued_at)] = sql.run(alias, sql.INSERT, _insert_params(job))
            return EnqueueResult(job.id, False, job.name, job.queue, enqueued_at)
        _refuse_oversized(alias, [job])
        now = timezone.now()
        _new_row(job, now).save(using=alias, force_insert=True)
        return EnqueueResult(job.id, False, job.name, job.queue, now)

    def _insert_keyed(self, job: NewJob) -> tuple[str, uuid.UUID, str | None, Any] | None:
        """Insert a job with a key once: ("inserted", id, None, enqueued_at), or the key's
        holder as ("completed" | "live", its id, its fingerprint, None); None if it moved on."""
        alias = self.db
        if _is_postgres(alias):
            rows = sql.run(alias, sql.INSERT_KEYED, _insert_params(job))
            if rows:
                kind, job_id, fingerprint, _notified, enqueued_at, recheck = rows[0]
                if recheck and (marker := sql.run(alias, sql.MARKER_OF_KEY, [job.key])):
                    self.filter(id=job_id).delete()  # in the caller's transaction
                    return ("completed", *marker[0], None)
                return kind, job_id, fingerprint, enqueued_at
        else:
            _refuse_oversized(alias, [job])
            markers = CompletionMarker.objects.using(alias)
            done = markers.filter(key=job.key).values_list("job_id", "fingerprint").first()
            if done is not None:
                return ("completed", *done, None)
            now = timezone.now()
            # Jobs waiting for the key already (after= a dead letter of it): see INSERT_KEYED.
            waiting = Dependency.objects.using(alias).filter(
                parent_key=job.key, satisfied_at__isnull=True
            )
            row = _new_row(replace(job, dependents=waiting.count()), now)
            try:
                with transaction.atomic(using=alias):
                    row.save(using=alias, force_insert=True)
                    # The insert may have waited for a live job of the key to settle
                    # (its marker written after the look above): look again.
                    again = markers.filter(key=job.key).values_list("job_id", "fingerprint")
                    if (late := again.first()) is not None:
                        raise _KeyCompleted(late)
                return "inserted", job.id, None, now
            except _KeyCompleted as completed:
                return ("completed", *completed.marker, None)
            except IntegrityError:
                pass  # a live job holds the key
        live = self.filter(key=job.key).values_list("id", "fingerprint").first()
        return None if live is None else ("live", *live, None)

    def insert_replays(self, jobs: Sequence[NewJob]) -> None:
        """Write the new jobs of a replay chunk in the open transaction: all of them, or none.

        The caller found their keys free (no marker, no live job) under the
        letters' row locks; a key taken or completed since raises _KeyRaced, and
        the caller rolls the chunk back and looks again. One statement on
        PostgreSQL (sql.INSERT_REPLAYS), whose due jobs wake listening workers at
        commit; bulk_create elsewhere.
        """
        alias = self.db
        keys = [job.key for job in jobs if job.key is not None]
        markers = CompletionMarker.objects.using(alias)
        if _is_postgres(alias):
            rows = sql.run(alias, sql.INSERT_REPLAYS, _replay_params(jobs))
            if len(rows) < len(jobs):
                raise _KeyRaced
            key_of = {job.id: job.key for job in jobs}
            recheck = [key_of[job_id] for job_id, _queue, again in rows if again]
            if recheck and markers.filter(key__in=recheck).exists():
                raise _KeyRaced
            notify(alias, {queue for _id, queue, _again in rows if queue is not None})
            return
        now = timezone.now()
        try:
            with transaction.atomic(using=alias):
                self.bulk_create([_new_row(job, now) for job in jobs], batch_size=BULK_BATCH)
        except IntegrityError:
            if self.filter(key__in=keys).exists() or markers.filter(key__in=keys).exists():
                raise _KeyRaced from None  # a live job of a key came in since the look
            raise
        # The insert may have waited for a live job of a key to settle: its marker
        # was written after the look (as _insert_keyed looks again).
        if keys and markers.filter(key__in=keys).exists():
            raise _KeyRaced

    # ---- workflows (docs/workflows.md) -------------------------------------

    def insert_after(
        self, job: NewJob, after: Sequence[Parent], on_parent_dead: str = "wait"
    ) -> EnqueueResult:
        """Write a job that runs once every job of `after` has finished, in the open transaction.

        Each parent is found as docs/workflows.md says ("Enqueue with after"): a
        live one counts its new dependent (a row lock held to the caller's
        commit), a finished one counts as done, a dead one (a pending letter,
        locked) counts as unfinished, and a replayed letter is followed to its
        replay. A parent found nowhere raises InvalidJob, and nothing is written.
        With on_parent_dead="dead" and a dead parent the job goes straight to the
        dead letters (parent_dead). A key held by a live or done job makes no
        row and registers nothing: the result is that job's, marked duplicate.
        """
        return _retrying_deadlocks(self.db, lambda: self._insert_after(job, after, on_parent_dead))

    def _insert_after(
        self, job: NewJob, after: Sequence[Parent], on_parent_dead: str
    ) -> EnqueueResult:
        alias = self.db
        with transaction.atomic(using=alias):
            located = _find_parents(alias, dict.fromkeys(after, 1))  # locked in id order
            found = _distinct([located[parent] for parent in after])  # edges in after= order
            _not_after_itself(job, found)
            if job.key is not None:
                _refuse_cycle(alias, job.key, lambda: [f.key for f in found if f.state != _DONE])
            unfinished = sum(1 for f in found if f.state != _DONE)
            dead = next((f for f in found if f.state == _DEAD), None)
            now = timezone.now()
            if dead is not None and on_parent_dead == OnParentDead.DEAD:
                holder = _key_holder(alias, job.key) if job.key is not None else None
                if holder is not None:
                    transaction.set_rollback(True, using=alias)
                    return _duplicate(job, *holder)
                _born_dead(job, dead, now).save(using=alias, force_insert=True)
                result = EnqueueResult(job.id, False, job.name, job.queue, now)
            else:
                if unfinished:
                    job = _block(job)
                result = self.insert(job)
                if result.duplicate:
                    transaction.set_rollback(True, using=alias)  # parents' counts too
                    return result
                if unfinished:
                    self.filter(id=job.id).update(waiting_for=unfinished, **_release_timing(job))
            Dependency.objects.using(alias).bulk_create(
                [_edge(job.id, f, on_parent_dead, now) for f in found]
            )
            return result

    def insert_workflow(self, workflow: str, steps: Sequence[Step]) -> list[EnqueueResult]:
        """Write a workflow's steps in the open transaction, in bulk; results in step order.

        Steps come in the order they were made, so a step's parents inside the
        workflow come before it: each one's waiting_for and dependents are known
        when it is written, with no round trip per step. Steps without a key go
        in at once (COPY on PostgreSQL, bulk_create elsewhere); a keyed step is
        inserted on its own (dedupe): when its key is held by a live or done job,
        it makes no row and its dependents in the workflow wait for that job.
        Parents outside the workflow are found as by insert_after, once each.
        """
        return _retrying_deadlocks(self.db, lambda: self._insert_workflow(workflow, steps))

    def _insert_workflow(self, workflow: str, steps: Sequence[Step]) -> list[EnqueueResult]:
        alias = self.db
        with transaction.atomic(using=alias):
            named: dict[int, int] = {}  # step index -> steps that name it
            outside: dict[Parent, int] = {}
            for step in steps:
                for parent in step.parents:
                    if isinstance(parent, int):
                        named[parent] = named.get(parent, 0) + 1
                    else:
                        outside[parent] = outside.get(parent, 0) + 1
            found = _find_parents(alias, outside)
            if _is_postgres(alias):
                now = sql.run(alias, "SELECT statement_timestamp()")[0][0]
            else:
                now = timezone.now()
            # Per step: how the steps after it see it, as a parent.
            seen: list[_Found] = []
            results: list[EnqueueResult] = []
            plain: list[NewJob] = []
            letters: list[DeadLetter] = []
            edges: list[tuple[uuid.UUID, _Found, str]] = []
            written: list[NewJob] = []  # the steps with a row or a letter
            held: dict[int, _Found] = {}  # keyed steps a live or done job holds: that job
            for index, step in enumerate(steps):
                parents = _distinct(
                    [
                        found[parent] if not isinstance(parent, int) else seen[parent]
                        for parent in step.parents
                    ]
                )
                job = step.job
                _not_after_itself(job, parents)
                if job.key is not None and step.parents:
                    _refuse_cycle(
                        alias,
                        job.key,
                        partial(_outside_ancestors, steps, index, found, held),
                    )
                key = job.key if job.key is not None else str(job.id)
                unfinished = sum(1 for f in parents if f.state != _DONE)
                dead = next((f for f in parents if f.state == _DEAD), None)
                if dead is not None and step.on_parent_dead == OnParentDead.DEAD:
                    holder = _key_holder(alias, job.key) if job.key is not None else None
                    if holder is not None:
                        results.append(_duplicate(job, *holder))
                        seen.append(_holder_seen(alias, job, named.get(index, 0), results[-1]))
                        held[index] = seen[-1]
                        continue
                    letters.append(_born_dead(job, dead, now))
                    results.append(EnqueueResult(job.id, False, job.name, job.queue, now))
                    seen.append(_Found(_DEAD, key, job.id))
                else:
                    job = replace(job, waiting_for=unfinished, dependents=named.get(index, 0))
                    if unfinished:
                        job = _block(job)
                    if job.key is None:
                        plain.append(job)
                        results.append(EnqueueResult(job.id, False, job.name, job.queue, now))
                    else:
                        result = self._insert_step(job)
                        results.append(result)
                        if result.duplicate:
                            seen.append(_holder_seen(alias, job, named.get(index, 0), results[-1]))
                            held[index] = seen[-1]
                            continue
                    seen.append(_Found(_LIVE, key, job.id))
                edges += [(job.id, f, step.on_parent_dead) for f in parents]
                written.append(job)
            if _is_postgres(alias):
                # COPY: its text rows built here beat adapting 10,000s of model instances.
                with connections[alias].cursor() as cursor:
                    raw = cursor.cursor
                    if plain:
                        with raw.copy(sql.COPY_STEPS) as copy:
                            copy.write(_copy_rows(plain, now, counts=True))
                    if edges:
                        with raw.copy(sql.COPY_EDGES) as copy:
                            copy.write(_copy_edges(edges, now))
                    if written:
                        with raw.copy(sql.COPY_WORKFLOW_STEPS) as copy:
                            copy.write(_copy_workflow_steps(workflow, written, now))
            else:
                _refuse_oversized(alias, plain)
                for batch in _packet_batches(alias, plain):
                    self.bulk_create([_new_row(job, now) for job in batch])
                Dependency.objects.using(alias).bulk_create(
                    [_edge(job_id, f, mode, now) for job_id, f, mode in edges],
                    batch_size=EDGE_BATCH,
                )
                WorkflowStep.objects.using(alias).bulk_create(
                    [
                        WorkflowStep(
                            job_id=job.id,
                            workflow=workflow,
                            name=job.name,
                            key=job.key,
                            created_at=now,
                        )
                        for job in written
                    ],
                    batch_size=EDGE_BATCH,
                )
            DeadLetter.objects.using(alias).bulk_create(letters, batch_size=BULK_BATCH)
            notify(alias, {job.queue for job in plain if (job.run_at or now) <= now})
            return results

    def _insert_step(self, job: NewJob) -> EnqueueResult:
        """Insert a keyed step (dedupe as insert does), then its counts when it has any."""
        result = self.insert(job)
        if not result.duplicate and (job.waiting_for or job.dependents):
            self.filter(id=job.id).update(
                waiting_for=job.waiting_for,
                dependents=F("dependents") + job.dependents,  # on those the insert counted
                **_release_timing(job),
            )
        return result

    def dead_letter_dependents(self, parents: Mapping[str, uuid.UUID]) -> list[DeadLetter]:
        """In the caller's transaction: parents (idempotency key -> job id) were just dead-lettered.

        Their blocked dependents whose edge says on_parent_dead="dead" go to the
        dead letters too (parent_dead), and so, recursively, do theirs; "wait"
        ones stay blocked. Called by every path that writes a dead letter, after
        the parent's row is gone: a dependent enqueued meanwhile held that row's
        lock until its commit, so this look sees its edge. One indexed query
        when there are no edges.
        """
        alias = self.db
        buried: list[DeadLetter] = []
        while parents:
            edges = (
                Dependency.objects.using(alias)
                .filter(
                    parent_key__in=list(parents),
                    satisfied_at__isnull=True,
                    on_parent_dead=OnParentDead.DEAD,
                )
                .values_list("job_id", "parent_key")
            )
            parent_of: dict[uuid.UUID, str] = {}
            for job_id, parent_key in edges:
                parent_of.setdefault(job_id, parent_key)
            if not parent_of:
                break
            dying = list(
                Job.objects.using(alias)
                .filter(id__in=list(parent_of), locked_by__isnull=True, waiting_for__gt=0)
                .order_by("id")
                .select_for_update()
            )
            if not dying:
                break
            _delete_locked(Job.objects.using(alias).filter(id__in=[j.id for j in dying]))
            now = timezone.now()
            letters = []
            for job in dying:
                parent_key = parent_of[job.id]
                error = error_entry(
                    job.attempts,
                    kind="django_jobs.ParentDead",
                    message=f"parent {parent_key} (job {parents[parent_key]}) was dead-lettered",
                    at=now,
                )
                letters.append(
                    DeadLetter.for_job(job, reason=DeadReason.PARENT_DEAD, error=error, dead_at=now)
                )
            buried += DeadLetter.objects.using(alias).bulk_create(letters)
            # Read under lock: a job without dependents has no edges to follow.
            parents = {
                job.key if job.key is not None else str(job.id): job.id
                for job in dying
                if job.dependents
            }
        return buried

    def parent_results(self, job_id: uuid.UUID) -> dict[str, Any]:
        """The results in the completion markers of a job's parents (docs/workflows.md).

        By the parent's dedupe key; a parent enqueued without one, by its handler's
        name, or "name[i]" (i from 0, in the order of `after=`) when several such
        parents share that name.
        """
        alias = self.db
        edges = list(
            Dependency.objects.using(alias)
            .filter(job_id=job_id)
            .order_by("id")
            .values_list("parent_key", "parent_id")
        )
        if not edges:
            return {}
        markers = {
            key: (job, name, result)
            for key, job, name, result in CompletionMarker.objects.using(alias)
            .filter(key__in=[key for key, _ in edges])
            .order_by()
            .values_list("key", "job_id", "name", "result")
        }
        # A parent without a dedupe key is waited for by its id as text: its own, or, once
        # it died and was replayed, its letter's (the replay's marker keeps that key).
        unkeyed = {
            key
            for key, parent in edges
            if key == str(parent) or (key in markers and key == str(markers[key][0]))
        }
        maybe = [i for key, _ in edges if key not in unkeyed and (i := _uuid_or_none(key))]
        if maybe:
            replayed = DeadLetter.objects.using(alias).filter(
                id__in=maybe, replay_job_id__isnull=False
            )
            unkeyed.update(str(i) for i in replayed.values_list("id", flat=True))
        found = [(key, key not in unkeyed, markers[key][1:]) for key, _ in edges if key in markers]
        names = Counter(name for _, keyed, (name, _) in found if not keyed)
        seen: Counter[str] = Counter()
        results: dict[str, Any] = {}
        for key, keyed, (name, result) in found:
            if keyed:
                results[key] = result
            elif names[name] == 1:
                results[name] = result
            else:
                results[f"{name}[{seen[name]}]"] = result
                seen[name] += 1
        return results

    def cancel_workflow(self, workflow: str, *, by: str = "") -> CancelReport:
        """Cancel the live steps of a workflow as cancel() does (running ones are left alone).

        A step that died and was replayed counts by its replay's job, as the
        workflow page shows it (a replay moves the step's row to its job; this
        covers a row left at the letter's id).
        """
        steps = WorkflowStep.objects.using(self.db).filter(workflow=workflow).values("job_id")
        replays = DeadLetter.objects.using(self.db).filter(
            id__in=steps, replay_job_id__isnull=False
        )
        return self.filter(Q(id__in=steps) | Q(id__in=replays.values("replay_job_id"))).cancel(
            by=by
        )

    # ---- worker ---------------------------------------------------------

    def claim(
        self,
        *,
        queues: Sequence[str],
        limit: int,
        token: str,
        lease: float,
        exclude_names: Sequence[str] = (),
        beat: Beat | None = None,
        names: Sequence[str] | None = None,
        flow_limits: Sequence[flow.Limit] = (),
        flow_claim: Collection[str] | None = None,
        others: bool = True,
    ) -> list[ClaimedJob]:
        """Lease up to `limit` jobs of `queues` to `token`, counting an attempt each.

        Jobs whose lease expired (their worker died, hung or lost its connection)
        are taken over first, so no task is needed to rescue them; then due jobs
        in priority order. Paused queues are left out, and so are jobs whose name
        is not in `names` (None: any name) or is in `exclude_names`. With `beat`,
        the worker's heartbeat row is refreshed in the same statement. The jobs of
        `flow_limits`' groups are claimed within their limits (PostgreSQL only;
        docs/flow-control.md); without any, the claim is one statement. `flow_claim`
        names the groups (Limit.key) whose jobs to claim now (None: all); the
        jobs of the others are left alone; so are jobs of no limited group unless
        `others` (or `beat`: the heartbeat rides on their claim).
        """
        if not queues:
            return []
        if flow_limits:
            return self._claim_flow(
                queues,
                limit,
                token,
                lease,
                exclude_names,
                beat,
                names,
                flow_limits,
                flow_claim,
                others,
            )[1]
        alias = self.db
        if not _is_postgres(alias) or conf.get("CLAIM") == "orm":
            if beat is not None:
                _write_beat(alias, beat)
            if limit <= 0:
                return []
            if not connections[alias].features.has_select_for_update_skip_locked:
                return self._claim_portable(queues, limit, token, lease, exclude_names, names)
            # The ORM claim: the same steps, each selection locking its rows and
            # skipping those another claim holds, all in one transaction.
            with transaction.atomic(using=alias):
                return self.select_for_update(skip_locked=True)._claim_portable(
                    queues, limit, token, lease, exclude_names, names
                )
        params = sql.claim_params(queues, limit, token, lease, exclude_names, beat, names)
        return _claimed(sql.run(alias, sql.CLAIM, params), token)

    def complete_and_claim(
        self,
        finished: Sequence[tuple[uuid.UUID, str, str | None, int]],
        *,
        queues: Sequence[str],
        limit: int,
        token: str,
        lease: float,
        exclude_names: Sequence[str] = (),
        beat: Beat | None = None,
        names: Sequence[str] | None = None,
        flow_limits: Sequence[flow.Limit] = (),
        flow_claim: Collection[str] | None = None,
        others: bool = True,
    ) -> tuple[Settled, list[ClaimedJob]]:
        """Settle `finished` as complete() does, then claim as claim() does.

        With flow limits (PostgreSQL), the settle runs in the limited claim's
        transaction, before its locks: one commit, and for one group one round
        trip, in which the slots the settle frees are claimed again. An error
        rolls both back. Returns complete()'s positions and claim()'s jobs.
        """
        if not flow_limits or not queues:
            settled = self.complete(finished)
            return settled, self.claim(
                queues=queues,
                limit=limit,
                token=token,
                lease=lease,
                exclude_names=exclude_names,
                beat=beat,
                names=names,
                others=others,
            )
        return self._claim_flow(
            queues,
            limit,
            token,
            lease,
            exclude_names,
            beat,
            names,
            flow_limits,
            flow_claim,
            others,
            finished,
        )

    def _claim_flow(
        self,
        queues: Sequence[str],
        limit: int,
        token: str,
        lease: float,
        exclude_names: Sequence[str],
        beat: Beat | None,
        names: Sequence[str] | None,
        flow_limits: Sequence[flow.Limit],
        flow_claim: Collection[str] | None = None,
        others: bool = True,
        finished: Sequence[tuple[uuid.UUID, str, str | None, int]] = (),
    ) -> tuple[Settled, list[ClaimedJob]]:
        """Claim the limited groups' jobs within their limits, then the others (PostgreSQL).

        The limited half is one transaction: the settle of `finished` (see
        complete_and_claim), the groups' advisory locks, then one CLAIM_LIMITED per
        group, each counting after the locks are granted. The other half is the
        usual claim, without the limited names and queues. Returns the positions
        in `finished` settled, and the jobs claimed.
        """
        alias = self.db
        limited_names = [g.value for g in flow_limits if g.kind == "name"]
        limited_queues = {g.value for g in flow_limits if g.kind == "queue"}
        groups = [
            g
            for g in flow_limits
            if (flow_claim is None or g.key in flow_claim)
            and (
                (g.kind == "queue" and g.value in queues)
                or (
                    g.kind == "name"
                    and (names is None or g.value in names)
                    and g.value not in exclude_names
                )
            )
        ]
        jobs: list[ClaimedJob] = []

        def group_params(group: flow.Limit) -> dict[str, Any]:
            claim = sql.claim_params(
                queues, limit - len(jobs), token, lease, exclude_names, None, names
            )
            return sql.claim_limited_params(group, claim, limited_names)

        batch = _id_order(finished)
        settled: Settled | None = None
        if len(groups) == 1 and limit > 0 and connections[alias].get_autocommit():
            # One group (a worker whose slot freed): settle, lock and claim in one round trip.
            [group] = groups
            done, rows = sql.run_locked(
                alias,
                group.key,
                sql.CLAIM_LIMITED[group.kind],
                group_params(group),
                before=_complete_statement(batch) if batch else None,
            )
            settled = _settled_of(done) if batch else None
            jobs += _claimed(rows, token)
        elif groups and limit > 0:
            with transaction.atomic(using=alias):
                if batch:
                    settled = _complete(alias, batch)
                sql.run(alias, sql.FLOW_LOCK, [sorted(g.key for g in groups)])
                for group in groups:
                    if len(jobs) >= limit:
                        break
                    rows = sql.run(alias, sql.CLAIM_LIMITED[group.kind], group_params(group))
                    jobs += _claimed(rows, token)
        if batch:  # what the fence left, settled on its own
            settled = self._settle_fenced(alias, batch, settled)
        done_at = settled or Settled()
        rest = max(limit - len(jobs), 0) if others else 0
        if not rest and beat is None:
            return done_at, jobs
        unlimited = [q for q in queues if q not in limited_queues]
        if conf.get("CLAIM") == "orm":
            if beat is not None:
                _write_beat(alias, beat)
            if rest and unlimited:
                with transaction.atomic(using=alias):
                    jobs += self.select_for_update(skip_locked=True)._claim_portable(
                        unlimited, rest, token, lease, exclude_names, names, limited_names
                    )
            return done_at, jobs
        params = {
            **sql.claim_params(unlimited, rest, token, lease, exclude_names, beat, names),
            "limited": limited_names,
        }
        return done_at, jobs + _claimed(sql.run(alias, sql.CLAIM_UNLIMITED, params), token)

    def _claim_portable(
        self,
        queues: Sequence[str],
        limit: int,
        token: str,
        lease: float,
        exclude_names: Sequence[str],
        names: Sequence[str] | None,
        limited: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        # Conditional UPDATEs: on SQLite each takes the write lock at once, and
        # re-checking the lease in the UPDATE keeps two workers from taking one row.
        paused = set(
            QueueState.objects.using(self.db).filter(paused=True).values_list("name", flat=True)
        )
        queues = [q for q in queues if q not in paused]
        now = Now()
        lease_until = now + timedelta(seconds=lease)
        attempted: list[uuid.UUID] = []
        known = self if names is None else self.filter(name__in=list(names))
        if limited:  # claimed within their limits by _claim_flow
            known = known.exclude(name__in=list(limited))
        expired = (
            known.filter(locked_by__isnull=False, queue__in=list(queues), lease_expires_at__lt=now)
            .order_by("lease_expires_at")
            .values_list("id", "locked_by", "attempts", "errors")[:limit]
        )
        for job_id, locked_by, attempts, errors in expired:
            # locked_by__isnull=False above: the lease's token.
            entry = lease_expired_entry(attempts, cast(str, locked_by), timezone.now())
            self.filter(id=job_id, locked_by=locked_by, lease_expires_at__lt=now).update(
                attempts=F("attempts") + 1,
                locked_by=token,
                lease_expires_at=lease_until,
                attempted_at=now,
                # A hand-edited non-list becomes one item, as jsonb's || does on PostgreSQL.
                errors=[*errors, entry] if isinstance(errors, list) else [errors, entry],
            )
            attempted.append(job_id)
        if limit > len(attempted):
            due = (
                known.filter(locked_by__isnull=True, queue__in=list(queues), run_at__lte=now)
                .exclude(name__in=list(exclude_names))
                .order_by("-priority", "run_at", "id")
            )
            wanted = limit - len(attempted)
            if self.query.select_for_update and connections[self.db].vendor == "mysql":
                candidates = self._lock_due_by_id(due, wanted)
            else:
                candidates = list(due.values_list("id", flat=True)[:wanted])
            self.filter(id__in=candidates, locked_by__isnull=True).update(
                attempts=F("attempts") + 1,
                locked_by=token,
                lease_expires_at=lease_until,
                attempted_at=now,
                started_at=Coalesce("started_at", now),
            )
            attempted += candidates
        rows = (
            self.filter(id__in=attempted, locked_by=token)
            .order_by("-priority", "run_at", "id")
            .values_list(*_CLAIMED_FIELDS)
        )
        # A row holds the twelve fields before token, then dependents: mypy cannot count them.
        jobs = [
            ClaimedJob(  # type: ignore[misc]
                *row[:12],
                token=token,
                dependents=row[12],
                run_at=row[13],
                trace_context=row[14],
                tags=row[15],
                meta=row[16],
            )
            for row in rows
        ]
        keys = {j.idempotency_key for j in jobs if j.key is not None or j.attempts > 1}
        if keys:
            done = set(
                CompletionMarker.objects.using(self.db)
                .filter(key__in=keys)
                .values_list("key", flat=True)
            )
            for job in jobs:
                job.completed = job.idempotency_key in done
        return jobs

    def _lock_due_by_id(self, due: JobQuerySet, wanted: int) -> list[uuid.UUID]:
        """Lock up to `wanted` of `due`'s jobs (MySQL, MariaDB), skipping locked ones.

        A locking read there locks every row it passes, matching or not: due jobs
        are found in the claim index's order, but a workflow's blocked steps
        (run_at far ahead) sit in the same queue range, and with fewer due jobs than
        wanted, or several queues (a filesort), the scan read and locked all of them
        and waited on rows a settle was deleting. So the due jobs are first read
        without locks, then locked by primary key, re-checked; those another claim
        took meanwhile are passed over, a few rounds at most.
        """
        peek = due.all()
        peek.query.select_for_update = False
        taken: list[uuid.UUID] = []
        seen: list[uuid.UUID] = []
        for _round in range(3):
            asked = wanted - len(taken)
            found = _ids_with_index(
                peek.exclude(id__in=seen).values_list("id", flat=True)[:asked],
                "django_jobs_job_claim",
            )
            if not found:
                break
            seen += found
            taken += _ids_with_index(
                self.filter(id__in=found, locked_by__isnull=True, run_at__lte=Now())
                .order_by("-priority", "run_at", "id")
                .values_list("id", flat=True),
                "PRIMARY",
            )
            if len(taken) >= wanted or len(found) < asked:  # all taken, or no more due
                break
        return taken

    def complete(self, finished: Sequence[tuple[uuid.UUID, str, str | None, int]]) -> Settled:
        """Settle (id, token, result JSON, dependents) as done: delete each job, write its marker.

        `dependents` is the job's count as its claim returned it. Rows whose lease
        another worker holds now are left alone; the positions (in `finished`) of
        those settled are returned. The jobs waiting for those settled are released
        in the same transaction (docs/workflows.md); `woke` says whether any became due.
        """
        if not finished:
            return Settled()
        alias = self.db
        if _is_postgres(alias):
            return self._settle_fenced(alias, _id_order(finished), None)
        token_of = {job_id: (token, result) for job_id, token, result, _ in finished}
        with transaction.atomic(using=alias):
            # Locking reads: MariaDB's plain SELECT reads the transaction's old
            # snapshot, which may not count a dependent registered since.
            if any(dependents for *_, dependents in finished):
                # With the jobs it may release, in id order, when theirs cross.
                family = _family(alias, list(token_of))
                list(self.select_for_update().filter(id__in=family).order_by("id"))
            rows = list(
                self.select_for_update()
                .filter(id__in=list(token_of))
                .order_by("id")
                .values_list(*_CLAIMED_FIELDS, "progress", "locked_by")
            )
            held = [row for row in rows if row[-1] == token_of[row[0]][0]]
            if not held:
                return Settled()
            _delete_locked(
                self.filter(
                    id__in=[row[0] for row in held], locked_by__in={row[-1] for row in held}
                )
            )
            now = timezone.now()
            CompletionMarker.objects.using(alias).bulk_create(
                [
                    CompletionMarker(
                        job_id=row[0],
                        key=row[7] if row[7] is not None else str(row[0]),
                        name=row[1],
                        queue=row[2],
                        attempts=row[5],
                        enqueued_at=row[9],
                        started_at=row[10],
                        completed_at=now,
                        worker_id=worker_of(row[-1]),
                        result=_json_loads(token_of[row[0]][1]),
                        fingerprint=row[8],
                        progress=row[-2],
                    )
                    for row in held
                ],
                ignore_conflicts=True,
            )
            keys = [row[7] if row[7] is not None else str(row[0]) for row in held if row[12]]
            woke = bool(keys) and self.release_dependents(keys) > 0
        ids = {row[0] for row in held}
        settled = Settled(index for index, (job_id, *_) in enumerate(finished) if job_id in ids)
        settled.woke = woke
        return settled

    def _settle_fenced(
        self,
        alias: str,
        batch: list[tuple[int, tuple[uuid.UUID, str, str | None, int]]],
        settled: Settled | None,
    ) -> Settled:
        """Return what sql.COMPLETE settled of batch (None: run it now), fenced rows included."""
        if settled is None:
            settled = _complete(alias, batch)
        if len(settled) < len(batch):
            # Fenced (a dependent registered since the claim) or lost: lock and look.
            again = self._complete_locked(alias, [item for item in batch if item[0] not in settled])
            settled |= again
            settled.woke = settled.woke or again.woke
        return settled

    def _complete_locked(
        self, alias: str, batch: list[tuple[int, tuple[uuid.UUID, str, str | None, int]]]
    ) -> Settled:
        """Settle again, locked, the jobs of a batch COMPLETE left alone (PostgreSQL).

        Its fence leaves a job whose dependents changed since its claim; here the
        row is locked first, so the settle reads the count as it is now and sees
        every edge. What is still not settled lost its lease.
        """
        ids = [job_id for _, (job_id, *_) in batch]
        tokens = list({token for _, (_, token, *_) in batch})
        with transaction.atomic(using=alias):
            now = {
                job_id: (locked_by, dependents)
                for job_id, locked_by, dependents in sql.run(
                    alias, sql.LOCK_SETTLING, {"ids": ids, "tokens": tokens}
                )
            }
            held = [
                (index, (job_id, token, result, now[job_id][1]))
                for index, (job_id, token, result, _) in batch
                if now.get(job_id, (None,))[0] == token
            ]
            return _complete(alias, held) if held else Settled()

    def complete_atomically(self, job: ClaimedJob, result: str | None) -> bool:
        """Inside the handler's transaction: delete the job and write its marker.

        Raises LeaseLost when another worker holds the job now (the caller's
        transaction must roll back). Returns False when a marker for the key
        already exists: the work was done before, and the caller must roll back
        this attempt's effects too. The jobs waiting for it are released in the
        same transaction; job.dependents is set to the count the settle found.
        """
        alias = self.db
        conn = connections[alias]
        if not conn.in_atomic_block:
            raise RuntimeError("complete_atomically must run inside transaction.atomic()")
        if _is_postgres(alias):
            statement = sql.COMPLETE_ATOMIC_LOCKING if job.dependents else sql.COMPLETE_ATOMIC
            [(deleted, marked, dependents)] = sql.run(
                alias, statement, {"id": job.id, "token": job.token, "result": result}
            )
            if not deleted:
                raise LeaseLost(f"job {job.id} was taken over by another worker")
            job.dependents = int(dependents)
            if marked and dependents:
                self.release_dependents([job.idempotency_key])
            return bool(marked)
        # A locking read: the count as it is now (see complete()).
        if job.dependents:
            list(self.select_for_update().filter(id__in=_family(alias, [job.id])).order_by("id"))
        dependents = (
            self.select_for_update()
            .filter(id=job.id, locked_by=job.token)
            .values_list("dependents", flat=True)
            .first()
        )
        if dependents is None or not self.filter(id=job.id, locked_by=job.token).delete()[0]:
            raise LeaseLost(f"job {job.id} was taken over by another worker")
        job.dependents = dependents
        marker = CompletionMarker(
            job_id=job.id,
            key=job.idempotency_key,
            name=job.name,
            queue=job.queue,
            attempts=job.attempts,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            completed_at=timezone.now(),
            worker_id=job.worker_id,
            result=_json_loads(result),
            fingerprint=job.fingerprint,
            progress=job.progress,
        )
        try:
            with transaction.atomic(using=alias):
                marker.save(using=alias, force_insert=True)
        except IntegrityError:
            return False
        if dependents:
            self.release_dependents([job.idempotency_key])
        return True

    def release_dependents(self, keys: Sequence[str]) -> int:
        """Satisfy the open edges on parent `keys`, count their jobs down, release those at 0.

        Runs inside the transaction that writes the keys' markers (complete() and
        complete_atomically() call it). An edge is satisfied once, so a key
        released twice counts nothing twice. A released job is due now, or later
        by its own delay or run_at (_released_run_at). Returns how many are due now
        (their queues' workers are woken at commit).
        """
        alias = self.db
        if not keys:
            return 0
        if _is_postgres(alias):
            [(made_due, _)] = sql.run(alias, sql.RELEASE, {"keys": list(keys), **_notify_params()})
            return int(made_due)
        with transaction.atomic(using=alias):
            edges = list(
                Dependency.objects.using(alias)
                .select_for_update()
                .filter(parent_key__in=list(keys), satisfied_at__isnull=True)
                .order_by("id")
                .values_list("id", "job_id")
            )
            if not edges:
                return 0
            Dependency.objects.using(alias).filter(id__in=[e for e, _ in edges]).update(
                satisfied_at=Now()
            )
            counts = Counter(job_id for _, job_id in edges)
            by_count: dict[int, list[uuid.UUID]] = {}
            due: list[uuid.UUID] = []
            queues = set()
            now, due_now = timezone.now(), 0
            for job_id, waiting_for, queue, delay, not_before in (
                self.select_for_update()
                .filter(id__in=list(counts))
                .order_by("id")
                .values_list("id", "waiting_for", "queue", "release_delay", "not_before")
            ):
                by_count.setdefault(counts[job_id], []).append(job_id)
                if waiting_for - counts[job_id] <= 0:
                    due.append(job_id)
                    if not delay and (not_before is None or not_before <= now):
                        due_now += 1  # not later, by its own timing
                        queues.add(queue)
            # One UPDATE per count, run_at apart: MySQL's SET sees the columns it set before.
            for n, ids in by_count.items():
                self.filter(id__in=ids).update(waiting_for=F("waiting_for") - n)
            if due:
                self.filter(id__in=due).update(run_at=_released_run_at())
            notify(alias, queues)
        return due_now

    def retry(self, job: ClaimedJob, *, delay: float, error: dict[str, Any]) -> bool:
        """Give up the lease and make the job due again after `delay` seconds."""
        return bool(
            self.filter(id=job.id, locked_by=job.token).update(
                locked_by=None,
                lease_expires_at=None,
                run_at=Now() + timedelta(seconds=delay),
                errors=[*job.errors, error],
            )
        )

    def release(self, jobs: Iterable[ClaimedJob]) -> int:
        """Give leases back without consuming the attempt their claim counted."""
        jobs = list(jobs)
        if not jobs:
            return 0
        return self.filter(
            id__in=[j.id for j in jobs], locked_by__in={j.token for j in jobs}
        ).update(locked_by=None, lease_expires_at=None, attempts=F("attempts") - 1)

    def extend_leases(self, jobs: Iterable[ClaimedJob], seconds: float) -> Leases:
        """Push the leases of jobs `seconds` ahead; say which are held and which were lost.

        A job whose row is gone because its own attempt settled it (an atomic
        handler's transaction deleted it and wrote its marker, and the worker
        has not heard yet) is neither held nor lost.
        """
        jobs = list(jobs)
        if not jobs:
            return Leases({}, frozenset())
        ids = [j.id for j in jobs]
        tokens = list({j.token for j in jobs})
        alias = self.db
        if _is_postgres(alias):
            held = dict(sql.run(alias, sql.EXTEND_LEASES, [float(seconds), ids, tokens]))
        else:
            leased = self.filter(id__in=ids, locked_by__in=tokens)
            leased.update(
                lease_expires_at=Greatest("lease_expires_at", Now() + timedelta(seconds=seconds))
            )
            held = {
                job_id: requested is not None
                for job_id, requested in leased.values_list("id", "cancel_requested_at")
            }
        missing = [j for j in jobs if j.id not in held]
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

    def dead_letter(
        self,
        job: ClaimedJob,
        *,
        reason: str,
        error: dict[str, Any],
        attempts: int | None = None,
    ) -> DeadLetter | None:
        """Move a held job to the dead letters in one transaction; None if its lease is gone."""
        alias = self.db
        held = self.filter(id=job.id, locked_by=job.token)
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
            self.dead_letter_dependents({job.idempotency_key: job.id})
            return letter

    # ---- operators (admin, commands) -------------------------------------

    def waiting(self) -> JobQuerySet:
        return self.filter(_waiting(Now()))

    def scheduled(self) -> JobQuerySet:
        return self.filter(_scheduled(Now()))

    def blocked(self) -> JobQuerySet:
        """JobState.BLOCKED: workflow steps waiting for their parents (docs/workflows.md)."""
        return self.filter(_blocked(Now()))

    def running(self) -> JobQuerySet:
        """JobState.RUNNING: leased jobs whose lease is live."""
        return self.filter(_running_now(Now()))

    def with_running(self) -> JobQuerySet:
        """Annotate `running`: whether the job is JobState.RUNNING (under a live lease)."""
        return self.annotate(
            running=ExpressionWrapper(_running_now(Now()), output_field=models.BooleanField())
        )

    def claimable(self) -> JobQuerySet:
        """Jobs a claim may take now: JobState.WAITING (due and unleased, or leased past
        their lease)."""
        return self.filter(_waiting(Now()))

    def due_for(self, *, queues: Sequence[str], names: Sequence[str] | None) -> JobQuerySet:
        """The jobs a claim of `queues` and `names` (None: any name) may take now.

        The database's view, row locks and flow limits aside: a job is due when it
        is waiting (unleased with its run time reached, or leased past its lease),
        of an unpaused queue of `queues` and, unless `names` is None, of a name in
        it. A job under a live lease, a scheduled or a blocked one (a blocked
        step's run_at is BLOCKED_UNTIL) is not. The one end condition of a
        `--burst` worker and of testing.drain() (through any_due): a claim that
        came back short because another claim held the rows, a lock race or a
        limit is not "nothing due".
        """
        paused = QueueState.objects.using(self.db).filter(paused=True, name__in=list(queues))
        due = self.filter(_waiting(Now()), queue__in=list(queues)).exclude(
            queue__in=paused.values("name")
        )
        return due if names is None else due.filter(name__in=list(names))

    def any_due(self, *, queues: Sequence[str], names: Sequence[str] | None) -> bool:
        """Whether due_for(queues=queues, names=names) holds a job."""
        return bool(queues) and self.due_for(queues=queues, names=names).exists()

    def names_unknown_to(self, known: Iterable[str]) -> models.QuerySet[Any, Mapping[str, Any]]:
        """Per name not in `known`: the number of its claimable jobs (`jobs`).

        One pass over the claimable rows (the name is in no index); the maintenance
        step that calls it spaces its calls by how long it takes.
        """
        return (
            self.claimable()
            .exclude(name__in=list(known))
            .order_by()
            .values("name")
            .annotate(jobs=models.Count("pk"))
        )

    def dead_letter_unknown(
        self, name: str, *, before: datetime, message: str, worker: str = "", limit: int = 500
    ) -> list[DeadLetter]:
        """Dead-letter as unknown_name up to `limit` claimable jobs of `name` due before `before`.

        For the upkeep, once no live worker has known the name for the grace period.
        One transaction: jobs a worker is claiming right now are skipped (SKIP
        LOCKED), and a job whose lease expired keeps the lost attempt in its errors.
        """
        alias = self.db
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
            deleted = _delete_locked(Job.objects.using(alias).filter(id__in=ids).claimable())
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
                    DeadLetter.for_job(
                        job, reason=DeadReason.UNKNOWN_NAME, error=error, dead_at=now
                    )
                )
            written = DeadLetter.objects.using(alias).bulk_create(letters)
            self.dead_letter_dependents(_with_dependents(rows))
            return written

    def counts_by_queue(self, now: Any = None) -> models.QuerySet[Any, Mapping[str, Any]]:
        """Per queue: waiting, scheduled, blocked and running jobs, and the oldest due run-at.

        `now` defaults to the database clock.
        """
        now = Now() if now is None else now
        return (
            self.order_by()
            .values("queue")
            .annotate(
                waiting=models.Count("pk", filter=_waiting(now)),
                scheduled=models.Count("pk", filter=_scheduled(now)),
                blocked=models.Count("pk", filter=_blocked(now)),
                running=models.Count("pk", filter=_running_now(now)),
                oldest=models.Min("run_at", filter=_waiting(now)),
            )
        )

    def with_state(self) -> JobQuerySet:
        """Annotate each job's JobState as `state`, on the database clock."""
        return self.annotate(
            state=Case(
                When(_running_now(Now()), then=Value(JobState.RUNNING)),
                When(_blocked(Now()), then=Value(JobState.BLOCKED)),
                When(_scheduled(Now()), then=Value(JobState.SCHEDULED)),
                default=Value(JobState.WAITING),
                output_field=models.CharField(),
            )
        )

    def run_now(self) -> int:
        """Make the selected scheduled jobs due at once; return how many were moved.

        Waiting, blocked and running jobs are left alone (the claim never takes a
        job whose run-at lies ahead, so this cannot race one; a blocked workflow
        step runs when its parents have finished, not before).
        """
        alias = self.db
        scheduled = self.scheduled()
        with transaction.atomic(using=alias):
            queues = sorted(set(scheduled.values_list("queue", flat=True)))
            moved = scheduled.update(run_at=Now())
            if moved:
                notify(alias, queues)
        return moved

    def cancel(self, *, by: str = "") -> CancelReport:
        """Move the selected unleased jobs to the dead letters as `cancelled`.

        A leased (running) job is left alone: its worker would not notice, and its
        settle would find no row. Jobs move in batches, each one transaction that
        deletes the rows and writes their letters.
        """
        alias = self.db
        report = CancelReport()
        for chunk in _chunks(list(self.values_list("id", flat=True)), 500):
            rows, present = _retrying_deadlocks(alias, partial(self._cancel_chunk, chunk, by))
            taken = {j.id for j in rows}
            report.cancelled += [j.id for j in rows]
            # As `jobs status` tells them apart, as the rows were when locked.
            now = timezone.now()
            report.blocked += sum(j.waiting_for > 0 for j in rows)
            report.scheduled += sum(j.waiting_for == 0 and j.run_at > now for j in rows)
            report.running += [i for i in chunk if i in present and i not in taken]
            report.gone += [i for i in chunk if i not in present]
        return report

    def _cancel_chunk(self, chunk: list[uuid.UUID], by: str) -> tuple[list[Job], set[uuid.UUID]]:
        """Cancel what of chunk is unleased, in one transaction; return it and what exists."""
        alias = self.db
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
            present = set(
                Job.objects.using(alias).filter(id__in=chunk).values_list("id", flat=True)
            )
            if rows:
                _delete_locked(
                    Job.objects.using(alias).filter(
                        id__in=[j.id for j in rows], locked_by__isnull=True
                    )
                )
                now = timezone.now()
                DeadLetter.objects.using(alias).bulk_create(
                    [_cancelled_letter(job, by, now) for job in rows]
                )
                self.dead_letter_dependents(_with_dependents(rows))
        return rows, present

    # ---- operations: snooze and cancellation (see control.py) ---------------

    def snooze(self, job: ClaimedJob, *, delay: float) -> bool:
        """Give up the lease, make the job due after `delay` seconds, and give back its attempt."""
        return bool(
            self.filter(id=job.id, locked_by=job.token).update(
                locked_by=None,
                lease_expires_at=None,
                run_at=Now() + timedelta(seconds=delay),
                attempts=F("attempts") - 1,
            )
        )

    def write_progress(self, job: ClaimedJob, progress: dict[str, Any]) -> bool:
        """Store a held job's progress (context.JobContext.progress); False if its lease is gone."""
        written = self.filter(id=job.id, locked_by=job.token).update(progress=progress) > 0
        if written:
            job.progress = progress
        return written

    def request_cancel(self) -> int:
        """Flag leased jobs for cancellation; their workers see it at their next heartbeat."""
        flagged = self.filter(locked_by__isnull=False, cancel_requested_at__isnull=True)
        # Settles delete and release these rows meanwhile: InnoDB may pick this as a
        # deadlock's victim, and one statement is safe to run again.
        return _retrying_deadlocks(self.db, partial(flagged.update, cancel_requested_at=Now()))


def _notify_params() -> dict[str, Any]:
    return {"channel": conf.get("CHANNEL"), "notify": bool(conf.get("LISTEN"))}


# A dead letter's payload longer than this (in characters) is copied from its job's row
# on the database server rather than sent with the letter (JobQuerySet.dead_letter()).
LETTER_PAYLOAD_SENT = 64 * 1024


@dataclass(frozen=True)
class Leases:
    """What JobQuerySet.extend_leases() found of the leases it was asked to extend."""

    # Each job still held, mapped to whether an operator asked to cancel it.
    held: dict[uuid.UUID, bool]
    # The jobs held by another token now, or settled by another attempt (or an operator).
    lost: frozenset[uuid.UUID]


class Settled(set[int]):
    """The positions JobQuerySet.complete() settled; `woke`: it made waiting jobs due."""

    woke: bool = False


def _complete(
    alias: str, batch: Sequence[tuple[int, tuple[uuid.UUID, str, str | None, int]]]
) -> Settled:
    """Run sql.COMPLETE on (position, (id, token, result, dependents)); return positions settled."""
    return _settled_of(sql.run(alias, *_complete_statement(batch)))


def _complete_statement(
    batch: Sequence[tuple[int, tuple[uuid.UUID, str, str | None, int]]],
) -> tuple[str, dict[str, Any]]:
    """Return the settle of (position, (id, token, result, dependents)) and its parameters.

    COMPLETE_RELEASING when a job of the batch had dependents at its claim, else
    COMPLETE, which has no release part to plan or run.
    """
    quoted: dict[str, str] = {}
    items = ",".join(
        f'{{"i":{index},"id":"{job_id}","token":'
        f"{quoted.get(token) or quoted.setdefault(token, json.dumps(token))},"
        f'"d":{int(dependents)},"result":{result if result is not None else "null"}}}'
        for index, (job_id, token, result, dependents) in batch
    )
    if any(dependents for _, (*_, dependents) in batch):
        return sql.COMPLETE_RELEASING, {"batch": f"[{items}]", **_notify_params()}
    return sql.COMPLETE, {"batch": f"[{items}]"}


def _settled_of(rows: list[tuple[Any, ...]]) -> Settled:
    """Return the positions sql.COMPLETE's rows say it settled, and whether it woke a queue."""
    settled = Settled(row[0] for row in rows if row[0] is not None)
    settled.woke = len(settled) < len(rows)  # a NULL row per queue woken
    return settled


def _json_loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# ---- operators' state changes: helpers and reports --------------------------


def notify(alias: str, queues: Iterable[str]) -> None:
    """Wake listening workers of queues at commit (PostgreSQL with LISTEN on; else nothing)."""
    if not _is_postgres(alias) or not conf.get("LISTEN"):
        return
    with connections[alias].cursor() as cursor:
        for queue in sorted(set(queues)):
            cursor.execute(sql.NOTIFY, [conf.get("CHANNEL"), queue])


def notify_freed(alias: str, keys: Iterable[str]) -> None:
    """Tell listening workers that slots of these limited groups (flow.Limit.key) freed."""
    if not _is_postgres(alias) or not conf.get("LISTEN"):
        return
    sql.run(
        alias,
        sql.NOTIFY_EACH,
        [conf.get("CHANNEL"), [flow.FREED + key for key in sorted(set(keys))]],
    )


def _insert_params(job: NewJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "queue": job.queue,
        "payload": job.payload,
        "priority": job.priority,
        "run_at": job.run_at,
        "delay": job.delay,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "fingerprint": job.fingerprint,
        "partition": job.partition,
        "trace_context": job.trace_context,
        "tags": None if job.tags is None else json.dumps(job.tags),
        "meta": None if job.meta is None else json.dumps(job.meta),
        "channel": conf.get("CHANNEL"),
        "notify": bool(conf.get("LISTEN")),
    }


def _replay_params(jobs: Sequence[NewJob]) -> dict[str, Any]:
    """The arrays of sql.INSERT_REPLAYS: one element per job, in the order of jobs."""
    return {
        name: [getattr(job, name) for job in jobs]
        for name in (
            "id",
            "name",
            "queue",
            "payload",
            "priority",
            "run_at",
            "delay",
            "max_attempts",
            "key",
            "fingerprint",
            "partition",
            "waiting_for",
            "dependents",
            "release_delay",
            "not_before",
            "trace_context",
        )
    } | {
        "tags": [None if job.tags is None else json.dumps(job.tags) for job in jobs],
        "meta": [None if job.meta is None else json.dumps(job.meta) for job in jobs],
    }


def _new_row(job: NewJob, now: datetime) -> Job:
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


def _claimed(rows: list[tuple[Any, ...]], token: str) -> list[ClaimedJob]:
    """Return the jobs of a claim statement's rows (sql.CLAIM, CLAIM_LIMITED)."""
    # errors come as JSON text (Django loads jsonb as text), NULL when empty.
    return [
        ClaimedJob(  # type: ignore[misc]  # row[:11]: the eleven fields before errors
            *row[:11],
            errors=json.loads(row[11]) if row[11] else [],
            token=token,
            completed=row[12],
            dependents=row[13],
            run_at=row[14],
            trace_context=row[15],
            tags=_json_loads(row[16]) if isinstance(row[16], str) else row[16],
            meta=_json_loads(row[17]) if isinstance(row[17], str) else row[17],
        )
        for row in rows
    ]


def _partition_of(name: str, payload: str) -> str | None:
    """Return the partition of a replayed payload under its handler's partition_by, if any."""
    handler = registry.lookup(name)
    if handler is None or handler.partition_by is None:
        return None
    try:
        return flow.partition_of(name, handler.partition_by, json.loads(payload))
    except (InvalidJob, ValueError):
        return None  # the letter's payload no longer partitions: its own partition (NULL)


def _duplicate(job: NewJob, existing_id: uuid.UUID, fingerprint: str | None) -> EnqueueResult:
    if fingerprint is not None and fingerprint != job.fingerprint:
        raise IdempotencyConflict(job.key or "", existing_id)
    return EnqueueResult(existing_id, True, job.name, job.queue)


# COPY's text format: backslash, tab, newline and carriage return are escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_rows(jobs: list[NewJob], now: datetime, *, counts: bool = False) -> str:
    """Return jobs as COPY text rows: building the text in Python beats adapting each value.

    With `counts`, each row ends with waiting_for, dependents, release_delay and
    not_before (sql.COPY_STEPS).
    """
    stamp = now.isoformat()
    run_ats: dict[tuple[datetime | None, float], str] = {}  # the jobs of one call share it
    lines = []
    for job in jobs:
        when = (job.run_at, job.delay)
        run_at = run_ats.get(when) or run_ats.setdefault(
            when, (job.run_at or now + timedelta(seconds=job.delay)).isoformat()
        )
        payload = job.payload
        if "\\" in payload or "\t" in payload or "\n" in payload or "\r" in payload:
            payload = payload.translate(_COPY_ESCAPES)
        partition = "\\N" if job.partition is None else job.partition.translate(_COPY_ESCAPES)
        trace = (
            _COPY_NULL if job.trace_context is None else job.trace_context.translate(_COPY_ESCAPES)
        )
        tags = _COPY_NULL if job.tags is None else json.dumps(job.tags).translate(_COPY_ESCAPES)
        meta = _COPY_NULL if job.meta is None else json.dumps(job.meta).translate(_COPY_ESCAPES)
        tail = (
            f"\t{job.waiting_for}\t{job.dependents}\t{_copy_interval(job.release_delay)}"
            f"\t{_COPY_NULL if job.not_before is None else job.not_before.isoformat()}\n"
            if counts
            else "\n"
        )
        lines.append(
            f"{job.id}\t{job.name}\t{job.queue}\t{payload}\t"
            f"{job.priority}\t{run_at}\t{stamp}\t0\t{job.max_attempts}\t[]\t{partition}"
            f"\t{trace}\t{tags}\t{meta}{tail}"
        )
    return "".join(lines)


# ---- workflows: finding parents, writing edges (docs/workflows.md) -----------

# Dependency and WorkflowStep rows per INSERT of a workflow (a few statements for 10,000 steps).
EDGE_BATCH = 5000


@dataclass(frozen=True, slots=True)
class Parent:
    """A job named in `after`: by id (an EnqueueResult's, or a UUID), or by dedupe key.

    With both, the id is looked up first and the key (the id's text, given as a
    string) after it.
    """

    id: uuid.UUID | None = None
    key: str | None = None

    def __str__(self) -> str:
        return str(self.id) if self.id is not None else repr(self.key)


@dataclass(slots=True)
class Step:
    """A validated workflow step (api.Workflow makes them, JobQuerySet.insert_workflow writes them).

    `parents` holds the index of an earlier step of the same workflow, or a
    Parent outside it.
    """

    job: NewJob
    parents: list[int | Parent]
    on_parent_dead: str = "wait"


_LIVE, _DONE, _DEAD = "live", "done", "dead"


@dataclass(frozen=True, slots=True)
class _Found:
    """A parent as found: live (its dependents counted), done (a marker) or dead (a letter)."""

    state: str
    key: str  # its idempotency key: the edge's parent_key
    id: uuid.UUID


def blocked_until() -> datetime:
    """BLOCKED_UNTIL as this project stores datetimes (naive when USE_TZ is off)."""
    return BLOCKED_UNTIL if settings.USE_TZ else BLOCKED_UNTIL.replace(tzinfo=None)


def _block(job: NewJob) -> NewJob:
    """Return job as written blocked: never due until its release, which applies its own
    delay (as release_delay) or run_at (as not_before) then (docs/workflows.md)."""
    delay = timedelta(seconds=job.delay) if job.run_at is None and job.delay else None
    return replace(
        job, run_at=blocked_until(), delay=0.0, release_delay=delay, not_before=job.run_at
    )


def _release_timing(job: NewJob) -> dict[str, Any]:
    """The release_delay and not_before of a blocked job that has them, as update() fields."""
    timing = {"release_delay": job.release_delay, "not_before": job.not_before}
    return {name: value for name, value in timing.items() if value is not None}


def _id_order(
    finished: Sequence[tuple[uuid.UUID, str, str | None, int]],
) -> list[tuple[int, tuple[uuid.UUID, str, str | None, int]]]:
    """A settle batch with its positions, in id order: its DELETE then locks rows in the
    order an enqueue locks its parents (_find_parents), so the two cannot deadlock."""
    return sorted(enumerate(finished), key=lambda item: item[1][0])


def _delete_locked(queryset: models.QuerySet[Any]) -> int:
    """Delete queryset's rows, which this transaction holds locked; return how many.

    MySQL and MariaDB plan a DELETE of many of a small table's ids as a full scan,
    which waits for every row it passes, ours or not: a settle holding its batch then
    waits for a row another transaction holds, out of id order, and deadlocks with
    one that waits for the batch (an enqueue naming both). FORCE INDEX (PRIMARY)
    keeps the DELETE to its own rows.
    """
    alias = queryset.db
    if connections[alias].vendor != "mysql":
        return queryset.delete()[0]
    query = queryset.query.clone()
    query.clear_ordering(force=True)
    query.__class__ = DeleteQuery
    statement, params = query.get_compiler(alias).as_sql()
    table = connections[alias].ops.quote_name(queryset.model._meta.db_table)
    plain = f"DELETE FROM {table} "  # noqa: S608 - a quoted table name, no input
    if not statement.startswith(plain):  # pragma: no cover - Django's single-table form
        return queryset.delete()[0]
    hinted = f"DELETE {table} FROM {table} FORCE INDEX (PRIMARY) " + statement[len(plain) :]
    with connections[alias].cursor() as cursor:
        cursor.execute(hinted, params)
        return int(cursor.rowcount)


def _ids_with_index(queryset: models.QuerySet[Any, Any], index: str) -> list[uuid.UUID]:
    """Run a values_list("id", flat=True) queryset with FORCE INDEX (index) on MySQL.

    The ORM has no index hints; the compiled statement (its FOR UPDATE SKIP LOCKED
    and LIMIT as they are) gets one after its table. Elsewhere, or for a statement
    of another form, the queryset runs as it is.
    """
    alias = queryset.db
    connection = connections[alias]
    if connection.vendor != "mysql":
        return list(queryset)
    try:
        statement, params = queryset.query.get_compiler(alias).as_sql()
    except EmptyResultSet:  # e.g. names=[]: Django runs no statement either
        return []
    table = connection.ops.quote_name(queryset.model._meta.db_table)
    plain = f" FROM {table} "  # noqa: S608 - a quoted table name, no input
    if statement.count(plain) != 1:  # pragma: no cover - Django's single-table form
        return list(queryset)
    hinted = statement.replace(plain, f"{plain}FORCE INDEX ({connection.ops.quote_name(index)}) ")
    with connection.cursor() as cursor:
        cursor.execute(hinted, params)
        return [queryset.model._meta.pk.to_python(row[0]) for row in cursor.fetchall()]


def _family(alias: str, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """What the ORM's settle of ids locks first (sql._lock_family with crossed_only).

    The jobs it may release whose ids sort before the batch's last, with the batch
    up to it; none when there are no such jobs: locking the batch then the
    released jobs keeps id order then.
    """
    keys = [
        key if key is not None else str(job_id)
        for job_id, key in Job.objects.using(alias)
        .filter(id__in=ids, dependents__gt=0)
        .values_list("id", "key")
    ]
    if not keys:
        return list(ids)
    edges = Dependency.objects.using(alias).filter(parent_key__in=keys, satisfied_at__isnull=True)
    last = max(ids)
    early = [job_id for job_id in edges.values_list("job_id", flat=True) if job_id < last]
    return sorted({*ids, *early}) if early else []


def _find_parents(alias: str, counts: Mapping[Parent, int]) -> dict[Parent, _Found]:
    """Find each parent (with its count of new dependents), locking the rows in id order.

    Every path that locks several jobs does it in id order: this one, a settle
    (sql.COMPLETE_RELEASING locks a batch and the jobs it releases together,
    _id_order) and a replay. A parent named by key is first looked up without a
    lock, for the id of the row it will lock: two enqueues that name the same
    parents, one by id and one by key, then wait for each other instead of each
    holding what the other needs (a deadlock).
    """
    if len(counts) < 2:
        return {parent: _find_parent(alias, parent, count) for parent, count in counts.items()}
    by_key = [p.key for p in counts if p.id is None and p.key is not None]
    row_of: dict[str | None, uuid.UUID] = {}
    if by_key:
        letters = DeadLetter.objects.using(alias).filter(key__in=by_key).order_by("-id")
        row_of.update(letters.values_list("key", "id"))  # the lowest id of each key wins
        row_of.update(Job.objects.using(alias).filter(key__in=by_key).values_list("key", "id"))
    # An id first (a key with no row locks nothing, or only markers: last).
    unseen = uuid.UUID(int=(1 << 128) - 1)

    def position(parent: Parent) -> tuple[uuid.UUID, str]:
        row = parent.id if parent.id is not None else row_of.get(parent.key, unseen)
        return row, parent.key or ""

    return {
        parent: _find_parent(alias, parent, counts[parent])
        for parent in sorted(counts, key=position)
    }


# How many times an enqueue after parents is tried when the database picks it as a
# deadlock's victim: what no lock order rules out (rows the application locks out
# of id order, a dependent committed while a settle waited for its parent). Each
# lost try has waited deadlock_timeout.
DEADLOCK_TRIES = 5
_PG_DEADLOCK = "40P01"
_MYSQL_DEADLOCK = 1213


def _is_deadlock(exc: BaseException) -> bool:
    """Whether exc is the database's "deadlock detected" (PostgreSQL, MySQL and MariaDB)."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == _PG_DEADLOCK:
        return True
    return bool(exc.args) and exc.args[0] == _MYSQL_DEADLOCK


def _retrying_deadlocks[T](alias: str, write: Callable[[], T]) -> T:
    """Run write (one transaction.atomic block), again when it lost a deadlock.

    The victim's block is rolled back, and with it the row locks it took: on
    PostgreSQL a savepoint's rollback releases them, so a write inside the
    caller's transaction is tried again in place. MySQL and MariaDB roll the
    whole transaction back: only a write that is its own transaction is retried
    there; inside the caller's, the error reaches the caller, whose transaction
    is gone.
    """
    own_transaction = not connections[alias].in_atomic_block
    for tries_left in range(DEADLOCK_TRIES - 1, -1, -1):
        try:
            return write()
        except OperationalError as exc:
            retry = tries_left and _is_deadlock(exc) and (own_transaction or _is_postgres(alias))
            if not retry:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _find_parent(alias: str, parent: Parent, count: int = 1) -> _Found:
    """Find a parent in the caller's transaction; a live one gets `count` more dependents.

    The UPDATE of a live parent takes its row lock until the caller commits: a
    settle of that row waits, then sees this edge (docs/workflows.md). A pending
    letter is locked so that a concurrent replay waits for the edge too.
    """
    jobs = Job.objects.using(alias)
    markers = CompletionMarker.objects.using(alias)
    letters = DeadLetter.objects.using(alias)
    job_id, key = parent.id, parent.key
    for _round in range(2 * DEDUPE_ROUNDS):
        if job_id is not None:
            if jobs.filter(id=job_id).update(dependents=F("dependents") + count):
                own = jobs.filter(id=job_id).values_list("key", flat=True).first()
                return _Found(_LIVE, own if own is not None else str(job_id), job_id)
            marked = markers.filter(job_id=job_id).values_list("key", flat=True).first()
            if marked is not None:
                return _Found(_DONE, marked, job_id)
            letter = (
                letters.filter(id=job_id).select_for_update().values_list("key", "replay_job_id")
            ).first()
            if letter is not None:
                letter_key, replay = letter
                if replay is None:
                    dead_key = letter_key if letter_key is not None else str(job_id)
                    return _Found(_DEAD, dead_key, job_id)
                job_id = replay  # replayed: its replay is the job to wait for
                continue
            if key is None or parent.id is None or job_id != parent.id:
                break
            job_id = None  # an id's text given as a string may be a dedupe key too
            continue
        assert key is not None  # noqa: S101 - a Parent has an id or a key
        holder = jobs.filter(key=key).values_list("id", flat=True).first()
        # By id alone: with its key too, InnoDB may take the key's index entry
        # first, which a settle deleting the row needs after locking it (a deadlock).
        if holder is not None and jobs.filter(id=holder).update(dependents=F("dependents") + count):
            return _Found(_LIVE, key, holder)
        marked_id = markers.filter(key=key).values_list("job_id", flat=True).first()
        if marked_id is not None:
            return _Found(_DONE, key, marked_id)
        # The key's letters by id, then locked by id: a letter's key is in no index,
        # and InnoDB's locking read by key scans the table, waiting for every row
        # another transaction holds (out of id order: a deadlock with an enqueue or
        # a replay that holds a letter further on and waits for one this one holds).
        letter_ids = list(letters.filter(key=key).order_by().values_list("id", flat=True))
        dead = list(  # locked in id order, as every path that locks several rows
            letters.filter(id__in=letter_ids, key=key)
            .order_by("id")
            .select_for_update()
            .values_list("id", "replay_job_id", "dead_at")
        )
        pending = [(dead_at, letter_id) for letter_id, replay, dead_at in dead if replay is None]
        if pending:
            latest = max(pending, key=lambda letter: (letter[0], -letter[1].int))
            return _Found(_DEAD, key, latest[1])
        if not dead:
            break
        # Every letter of the key was replayed, maybe just now: its job is live or done.
    raise _no_such_parent(parent)


def _no_such_parent(parent: Parent) -> InvalidJob:
    return InvalidJob(f"after: no such job {parent} (not live, finished or dead-lettered)")


# Parents per existence check (three IN lists of this many: under SQLite's and
# PostgreSQL's limits on parameters per statement).
EXISTS_BATCH = 5000


def check_parents_exist(alias: str, parents: Sequence[Parent]) -> None:
    """Raise InvalidJob for the first parent found nowhere, reading only: no lock, no count.

    A parent exists when a live job, a completion marker or a dead letter holds
    its id, or its key (an id's text given as a string: either); a letter
    counts replayed or not (the write follows it to its replay). The ids are
    read in one statement, then the keys of the parents still unfound in one.
    For enqueue_on_commit(commit_of=...), which writes the job later: a missing
    parent is refused from the call, while the caller's transaction can still
    roll back. _find_parent, at the write, stays the lookup that decides.
    """
    found_ids = _held(alias, "id", [p.id for p in parents if p.id is not None])
    unfound = [p.key for p in parents if p.key is not None and p.id not in found_ids]
    found_keys = _held(alias, "key", unfound)
    for parent in parents:
        if parent.id not in found_ids and parent.key not in found_keys:
            raise _no_such_parent(parent)


def _held(alias: str, column: str, values: list[Any]) -> set[Any]:
    """Which of values ("id"s or "key"s) a live job, a marker or a dead letter holds."""
    marker = "job_id" if column == "id" else column
    found: set[Any] = set()
    for chunk in _chunks(list(dict.fromkeys(values)), EXISTS_BATCH):
        jobs, markers, letters = (
            model._default_manager.using(alias)
            .filter(**{f"{name}__in": chunk})
            .order_by()  # no Meta.ordering: a UNION takes none, inside or around it
            .values_list(name, flat=True)
            for model, name in ((Job, column), (CompletionMarker, marker), (DeadLetter, column))
        )
        found.update(jobs.union(markers, letters, all=True).order_by())
    return found


def _not_after_itself(job: NewJob, found: Iterable[_Found]) -> None:
    """Refuse a job that would wait for its own key (a dead letter of it): it never runs."""
    if job.key is not None and any(f.key == job.key and f.state == _DEAD for f in found):
        raise InvalidJob(
            f"key {job.key!r}: a job cannot wait for a dead letter of its own key "
            "(replay that letter instead)"
        )


def _waiting_for(
    alias: str, key: str, *, lock: bool = True, dead_key: bool = False
) -> dict[str, str]:
    """The keys of the jobs and pending letters that wait for `key`, directly or not.

    Each maps to the key it waits for on its way to `key` (to name a cycle);
    `key` itself is among them when a job of it waits for itself already. A
    downward walk along the parent_key index, one level at a time, each row
    locked before its waiters are read: the key's pending letters first, then
    the waiters found, live jobs and pending letters (their replays wait again),
    by id. An enqueue that registers a waiter on one of them (it locks the job
    it waits for, or the letters of its key) is then either seen here or waits
    for this transaction, and its own walk sees this one's edges: two
    transactions cannot each build half of a cycle (docs/workflows.md "Cycles").
    One indexed query when the key has no pending letter (the usual case).
    Without `lock`, a look that locks nothing (jobs status); with `dead_key`, the
    key is a letter's being replayed (no longer pending in this transaction).
    """
    letters = DeadLetter.objects.using(alias).pending()
    jobs = Job.objects.using(alias)
    edges = Dependency.objects.using(alias).filter(satisfied_at__isnull=True)
    if lock:
        letters, jobs = letters.select_for_update(), jobs.select_for_update()
    own = letters.filter(key=key).order_by("id")
    if not list(own.values_list("id", flat=True)) and not dead_key:
        # Without a pending letter of the key, nothing can wait for it but a live job of
        # the key (the new job is then a duplicate), nor start to while this one runs.
        return {}
    via: dict[str, str] = {}
    frontier = [key]
    while frontier:
        waits: dict[uuid.UUID, str] = {}
        for chunk in _chunks(frontier, EXISTS_BATCH):
            for job_id, parent_key in edges.filter(parent_key__in=chunk).values_list(
                "job_id", "parent_key"
            ):
                waits.setdefault(job_id, parent_key)
        frontier = []
        for chunk in _chunks(sorted(waits), EXISTS_BATCH):
            for model in (jobs, letters):
                rows = model.filter(id__in=chunk).order_by("id")
                for node_id, node_key in rows.values_list("id", "key"):
                    own_key = node_key if node_key is not None else str(node_id)
                    if own_key not in via:
                        via[own_key] = waits[node_id]
                        if own_key != key:
                            frontier.append(own_key)
    return via


# Keys `cycles` looks at, at most: the status command's cost stays bounded.
CYCLE_CANDIDATES = 100


def cycles(alias: str, limit: int = 3) -> list[tuple[uuid.UUID, list[str], list[uuid.UUID]]]:
    """Blocked jobs that wait for themselves, and the keys of each one's cycle.

    Enqueues refuse them (_refuse_cycle); a database written before may hold
    them. Each closes through a job of a dead key enqueued again, blocked and
    with dependents: that job's id, the keys from its own round to it ("kx",
    "ky": kx waits for ky, which waits for kx), and the key's pending letters
    (their replay, once that job is cancelled, releases the others). Locks nothing.
    """
    pending = DeadLetter.objects.using(alias).pending().filter(key=OuterRef("key"))
    closing = (
        Job.objects.using(alias)
        .filter(waiting_for__gt=0, dependents__gt=0, key__isnull=False)
        .filter(Exists(pending))
        .order_by("enqueued_at", "id")
        .values_list("id", "key")
    )
    found: list[tuple[uuid.UUID, list[str], list[uuid.UUID]]] = []
    covered: set[str] = set()
    for job_id, key in closing[:CYCLE_CANDIDATES]:
        if key is None or key in covered:  # key is not None: filtered above
            continue
        via = _waiting_for(alias, key, lock=False)
        if key not in via:
            continue
        chain = [key]
        while (step := via[chain[-1]]) != key:
            chain.append(step)
        covered.update(chain)
        letters = DeadLetter.objects.using(alias).pending().filter(key=key).order_by("dead_at")
        found.append((job_id, chain, list(letters.values_list("id", flat=True))))
        if len(found) >= limit:
            break
    return found


class _Cycle(InvalidJob):
    """A job would wait for its own waiters (_refuse_cycle)."""


def _refuse_cycle(
    alias: str, key: str, parents: Callable[[], Iterable[str]], *, dead_key: bool = False
) -> None:
    """Raise InvalidJob if a job of `key` after `parents()` (their keys) would wait for itself.

    A dead letter does not hold its key: jobs may wait for the key already (after=
    the letter), and a job of the key enqueued after one of them would wait for
    its own dependents, and they for it, with nothing to release either.
    """
    via = _waiting_for(alias, key, dead_key=dead_key)
    if not via:
        return
    for parent in sorted(set(parents())):
        if parent not in via:
            continue
        chain = [parent]
        while chain[-1] != key:
            chain.append(via[chain[-1]])
        waits = ", which waits for ".join(repr(k) for k in chain)
        raise _Cycle(
            f"key {key!r}: after {parent!r} would close a cycle: the job would wait for "
            f"{waits} (after a dead letter of {key!r}), and nothing could release them. "
            f"Replay that letter, or enqueue {key!r} without {parent!r} in after="
        )


def _outside_ancestors(
    steps: Sequence[Step], index: int, found: Mapping[Parent, _Found], held: Mapping[int, _Found]
) -> set[str]:
    """The keys outside the workflow that step `index` waits for, through earlier steps too.

    A step's parents in the workflow come before it; a keyed step a job outside
    holds (a duplicate) is that job, as its dependents see it.
    """
    keys: set[str] = set()
    stack, visited = [index], {index}
    while stack:
        for parent in steps[stack.pop()].parents:
            if not isinstance(parent, int):
                if found[parent].state != _DONE:
                    keys.add(found[parent].key)
            elif parent in held:
                if held[parent].state != _DONE:
                    keys.add(held[parent].key)
            elif parent not in visited:
                visited.add(parent)
                stack.append(parent)
    return keys


def _distinct(found: Iterable[_Found]) -> list[_Found]:
    """One edge per parent key (a job named twice, by id and by key, say)."""
    return list({f.key: f for f in found}.values())


def _key_holder(alias: str, key: str) -> tuple[uuid.UUID, str | None] | None:
    """The (id, fingerprint) of the finished or live job that holds a key, if any."""
    done = CompletionMarker.objects.using(alias).filter(key=key)
    marker = done.values_list("job_id", "fingerprint").first()
    if marker is not None:
        return marker
    return Job.objects.using(alias).filter(key=key).values_list("id", "fingerprint").first()


def _holder_seen(alias: str, job: NewJob, named: int, result: EnqueueResult) -> _Found:
    """How the steps naming a duplicate keyed step see it: as the job that holds its key."""
    if not named:
        return _Found(_DONE, cast(str, job.key), result.id)  # no step waits for it
    return _find_parent(alias, Parent(key=job.key), named)


def _born_dead(job: NewJob, parent: _Found, now: datetime) -> DeadLetter:
    """The letter of a job whose parent is dead when it is written (on_parent_dead="dead")."""
    error = error_entry(
        0,
        kind="django_jobs.ParentDead",
        message=f"parent {parent.key} (job {parent.id}) is dead-lettered",
        at=now,
    )
    return DeadLetter(
        id=job.id,
        **definition(job),
        attempts=0,
        reason=DeadReason.PARENT_DEAD,
        error=storable_text(error_summary(error), MAX_LABEL + MAX_MESSAGE + 64),
        errors=[error],
        enqueued_at=now,
        dead_at=now,
    )


def _edge(job_id: uuid.UUID, parent: _Found, on_parent_dead: str, now: datetime) -> Dependency:
    return Dependency(
        job_id=job_id,
        parent_key=parent.key,
        parent_id=parent.id,
        on_parent_dead=on_parent_dead,
        created_at=now,
        satisfied_at=now if parent.state == _DONE else None,
    )


_COPY_NULL = "\\N"


def _copy_text(value: str | None) -> str:
    return _COPY_NULL if value is None else value.translate(_COPY_ESCAPES)


def _copy_edges(edges: list[tuple[uuid.UUID, _Found, str]], now: datetime) -> str:
    """Return a workflow's edges as COPY text rows (sql.COPY_EDGES)."""
    stamp = now.isoformat()
    return "".join(
        f"{job_id}\t{_copy_text(f.key)}\t{f.id}\t{mode}\t{stamp}\t"
        f"{stamp if f.state == _DONE else _COPY_NULL}\n"
        for job_id, f, mode in edges
    )


def _copy_interval(value: timedelta | None) -> str:
    return _COPY_NULL if value is None else f"{value.total_seconds() * 1_000_000:.0f} microseconds"


def _copy_workflow_steps(workflow: str, jobs: list[NewJob], now: datetime) -> str:
    """Return a workflow's steps as COPY text rows (sql.COPY_WORKFLOW_STEPS)."""
    stamp = now.isoformat()
    name = _copy_text(workflow)
    return "".join(
        f"{job.id}\t{name}\t{_copy_text(job.name)}\t{_copy_text(job.key)}\t{stamp}\n"
        for job in jobs
    )


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _with_dependents(rows: Iterable[Job]) -> dict[str, uuid.UUID]:
    """The idempotency keys (-> ids) of jobs read under lock that have dependents."""
    return {
        job.key if job.key is not None else str(job.id): job.id for job in rows if job.dependents
    }


def _cancelled_letter(job: Job, by: str, now: datetime) -> DeadLetter:
    error = error_entry(
        job.attempts,
        kind="django_jobs.Cancelled",
        message=f"cancelled by {by}" if by else "cancelled",
        at=now,
    )
    return DeadLetter.for_job(job, reason=DeadReason.CANCELLED, error=error, dead_at=now)


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


@dataclass
class CancelReport:
    """What JobQuerySet.cancel did, job ids by outcome."""

    cancelled: list[uuid.UUID] = field(default_factory=list)
    blocked: int = 0  # of the cancelled: workflow steps waiting for their parents
    scheduled: int = 0  # of the cancelled: due later; the others were due (waiting)
    running: list[uuid.UUID] = field(default_factory=list)  # leased: left alone
    gone: list[uuid.UUID] = field(default_factory=list)  # finished or moved meanwhile

    def __str__(self) -> str:
        parts = [f"{len(self.cancelled)} cancelled"]
        if self.running:
            parts.append(f"{len(self.running)} running (not cancelled)")
        if self.gone:
            parts.append(f"{len(self.gone)} no longer live")
        return ", ".join(parts)


@dataclass
class ReplayReport:
    """What DeadLetterQuerySet.replay did, dead-letter ids by outcome."""

    replayed: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)  # letter -> new job
    already: list[uuid.UUID] = field(default_factory=list)  # replayed before
    key_taken: list[uuid.UUID] = field(default_factory=list)  # a live job holds the key
    completed: list[uuid.UUID] = field(default_factory=list)  # the key's work is done
    unknown: list[uuid.UUID] = field(default_factory=list)  # no handler by that name
    cycles: list[uuid.UUID] = field(default_factory=list)  # it would wait for its own waiters

    def add(self, other: ReplayReport) -> None:
        """Add the outcomes of other (a later batch) to this report."""
        self.replayed.update(other.replayed)
        self.already += other.already
        self.key_taken += other.key_taken
        self.completed += other.completed
        self.unknown += other.unknown
        self.cycles += other.cycles

    @property
    def total(self) -> int:
        return (
            len(self.replayed)
            + len(self.already)
            + len(self.key_taken)
            + len(self.completed)
            + len(self.unknown)
            + len(self.cycles)
        )

    def __str__(self) -> str:
        parts = [f"{len(self.replayed)} replayed"]
        if self.already:
            parts.append(f"{len(self.already)} already replayed")
        if self.key_taken:
            parts.append(
                _plural(
                    len(self.key_taken), "whose key a live job holds", "whose keys live jobs hold"
                )
            )
        if self.completed:
            parts.append(f"{len(self.completed)} whose key has completed since")
        if self.unknown:
            parts.append(f"{len(self.unknown)} with no handler registered under its name")
        if self.cycles:
            parts.append(f"{len(self.cycles)} that would close a cycle (docs/workflows.md)")
        return ", ".join(parts)


# Dead letters replayed per transaction: few commits and one NOTIFY per queue per
# batch, without one huge transaction. Each batch is a few statements, whatever
# its size (_replay_letters).
REPLAY_BATCH = 1000


class _Letter(NamedTuple):
    """The fields of a dead letter its replay reads (_REPLAYED)."""

    id: uuid.UUID
    name: str
    queue: str
    payload: str
    priority: int
    max_attempts: int
    key: str | None
    fingerprint: str | None
    replayed_at: datetime | None
    trace_context: str | None
    tags: list[str] | None
    meta: dict[str, str] | None

    @property
    def edge_key(self) -> str:
        """The key its dependents' edges name it by: its key, or its id as text."""
        return self.key if self.key is not None else str(self.id)


_REPLAYED = _Letter._fields


class _Edge(NamedTuple):
    """A Dependency row as a replay reads it."""

    id: int
    job_id: uuid.UUID
    parent_key: str
    parent_id: uuid.UUID
    on_parent_dead: str
    satisfied_at: datetime | None


def _replay_chunk(
    alias: str, chunk: list[uuid.UUID], by: str, run_at: datetime | None, delay: float
) -> ReplayReport:
    """Replay the letters of chunk in one transaction, again when it lost a race or a deadlock."""
    cyclic: set[uuid.UUID] = set()
    for _round in range(DEDUPE_ROUNDS + len(chunk)):
        # A replay locks its letters, then their parents: out of id order, so InnoDB
        # may pick it as a deadlock's victim; its chunk is then tried again whole.
        rest = [letter for letter in chunk if letter not in cyclic]
        replay = partial(_replay_letters, alias, rest, by, run_at, delay)
        try:
            report = _retrying_deadlocks(alias, replay) if rest else ReplayReport()
        except _KeyRaced:
            continue  # a key changed hands between the look and the insert: look again
        except _ReplayCycles as found:
            cyclic |= found.letters  # rolled back: the chunk again without them
            continue
        report.cycles += sorted(cyclic)
        return report
    raise InvalidJob("replay: the keys of these letters keep changing hands; try again")


def _replay_letters(
    alias: str, chunk: list[uuid.UUID], by: str, run_at: datetime | None, delay: float
) -> ReplayReport:
    """Replay the letters of chunk in one transaction; return what it did.

    A few statements for the chunk, none per letter: lock the letters (in id
    order, as every path that locks several rows), read their edges, look their
    keys up, find the parents of their own edges (only when they have some),
    insert the jobs, copy the edges, move the workflow steps, mark the letters.
    """
    report = ReplayReport()
    with transaction.atomic(using=alias):
        rows = (
            DeadLetter.objects.using(alias)
            .filter(id__in=chunk)
            .order_by("id")
            .select_for_update()
            .values_list(*_REPLAYED)
        )
        letters: list[_Letter] = []
        for row in rows:
            letter = _Letter(*row)
            # Locked, so replayed_at is current: a concurrent replay of it has committed.
            if letter.replayed_at is not None:
                report.already.append(letter.id)
            elif registry.lookup(letter.name) is None:
                report.unknown.append(letter.id)
            else:
                letters.append(letter)
        if not letters:
            return report
        own, waiting = _replay_edges_of(alias, letters)
        jobs = _replay_jobs(alias, letters, waiting, run_at, delay, report)
        if not jobs:
            return report
        copies, live = _copy_replayed_edges(alias, own, jobs)
        _refuse_replay_cycles(alias, jobs, copies)
        Job.objects.using(alias).insert_replays(list(jobs.values()))
        if copies:
            Dependency.objects.using(alias).bulk_create(copies, batch_size=EDGE_BATCH)
        # The live parents the copies wait for (locked) count their new dependents.
        for part in _chunks(sorted(live), EXISTS_BATCH):
            counts = {job_id: live[job_id] for job_id in part}
            Job.objects.using(alias).filter(id__in=part).update(
                dependents=F("dependents") + _ById("id", counts, models.IntegerField())
            )
        _mark_replayed(alias, jobs, by[:MAX_BY_LENGTH])
        report.replayed.update((letter, job.id) for letter, job in jobs.items())
    return report


def _refuse_replay_cycles(
    alias: str, jobs: Mapping[uuid.UUID, NewJob], copies: Sequence[Dependency]
) -> None:
    """Raise _ReplayCycles for the letters whose replays would wait for their own waiters.

    A job of the key enqueued after one of the letter's waiters (and cancelled,
    say) left the letter waiting for it: replayed, it would wait for itself. One
    walk down from every key of the chunk together, as _waiting_for walks from one
    (the same locks): a few statements a level, not per letter.
    """
    waited: dict[uuid.UUID, set[str]] = {}
    for copy in copies:
        if copy.satisfied_at is None:
            waited.setdefault(copy.job_id, set()).add(copy.parent_key)
    sources = {
        job.key: letter
        for letter, job in jobs.items()
        if job.key is not None and job.dependents and job.id in waited
    }
    if not sources:
        return  # no waiters, or no unfinished parents: no cycle through them
    letters = DeadLetter.objects.using(alias).pending().select_for_update()
    rows = Job.objects.using(alias).select_for_update()
    edges = Dependency.objects.using(alias).filter(satisfied_at__isnull=True)
    below: dict[str, set[str]] = {}  # a key that waits for sources' keys: those keys
    frontier: dict[str, set[str]] = {key: {key} for key in sources}
    while frontier:
        waits: dict[uuid.UUID, set[str]] = {}
        for part in _chunks(sorted(frontier), EXISTS_BATCH):
            found = edges.filter(parent_key__in=part).values_list("job_id", "parent_key")
            for job_id, parent_key in found:
                waits.setdefault(job_id, set()).update(frontier[parent_key])
        frontier = {}
        for part in _chunks(sorted(waits), EXISTS_BATCH):
            for model in (rows, letters):
                for node_id, node_key in (
                    model.filter(id__in=part).order_by("id").values_list("id", "key")
                ):
                    key = node_key if node_key is not None else str(node_id)
                    new = waits[node_id] - below.get(key, set())
                    if new:
                        below.setdefault(key, set()).update(new)
                        frontier.setdefault(key, set()).update(new)
    cyclic = {
        letter
        for key, letter in sources.items()
        if any(key in below.get(parent, ()) for parent in waited[jobs[letter].id])
    }
    if cyclic:
        raise _ReplayCycles(cyclic)


def _replay_edges_of(
    alias: str, letters: list[_Letter]
) -> tuple[dict[uuid.UUID, list[_Edge]], Counter[str]]:
    """Return the letters' own edges (by letter, in id order) and the unsatisfied edges
    that wait for each letter's key (by key), in one query.

    Read after the letters are locked: an enqueue that found a letter pending held
    its lock until its edge committed, so the count sees that edge; later ones
    follow replay_job_id to the new job.
    """
    edges = (
        Dependency.objects.using(alias)
        .filter(
            Q(job_id__in=[letter.id for letter in letters])
            | Q(parent_key__in=[letter.edge_key for letter in letters], satisfied_at__isnull=True)
        )
        .order_by("id")
        .values_list(*_Edge._fields)
    )
    ids = {letter.id for letter in letters}
    keys = {letter.edge_key for letter in letters}
    own: dict[uuid.UUID, list[_Edge]] = {}
    waiting: Counter[str] = Counter()
    for row in edges:
        edge = _Edge(*row)
        if edge.job_id in ids:
            own.setdefault(edge.job_id, []).append(edge)
        if edge.satisfied_at is None and edge.parent_key in keys:
            waiting[edge.parent_key] += 1
    return own, waiting


def _replay_jobs(
    alias: str,
    letters: list[_Letter],
    waiting: Counter[str],
    run_at: datetime | None,
    delay: float,
    report: ReplayReport,
) -> dict[uuid.UUID, NewJob]:
    """Return the new job of each letter whose key is free (by letter id, in id order).

    A letter whose key has unsatisfied edges gives its job that key (its id as
    text, when it has no dedupe key), so that the job's marker satisfies them. A
    key with a completion marker, or held by a live job or by an earlier letter of
    the chunk, makes no job: the letter goes to report.completed or key_taken.
    """
    jobs: dict[uuid.UUID, NewJob] = {}
    for letter in letters:
        count = waiting[letter.edge_key]
        key, fingerprint = letter.key, letter.fingerprint
        if count:  # its dependents wait for its key: the new job's marker must carry it
            key, fingerprint = letter.edge_key, _letter_fingerprint(letter)
        jobs[letter.id] = NewJob(
            id=uuid7(),
            name=letter.name,
            queue=letter.queue,
            payload=letter.payload,
            priority=letter.priority,
            run_at=run_at,
            delay=delay,
            max_attempts=letter.max_attempts,
            key=key,
            fingerprint=fingerprint,
            partition=_partition_of(letter.name, letter.payload),
            dependents=count,
            tags=letter.tags,
            meta=letter.meta,
        )
    tracing.replayed(letters, jobs)
    keys = [job.key for job in jobs.values() if job.key is not None]
    completed: set[str | None] = set()
    live: set[str | None] = set()
    if keys:
        markers = CompletionMarker.objects.using(alias).filter(key__in=keys)
        completed = set(markers.values_list("key", flat=True))
        live = set(Job.objects.using(alias).filter(key__in=keys).values_list("key", flat=True))
    for letter in letters:
        key = jobs[letter.id].key
        if key is None:
            continue
        if key in completed or key in live:
            del jobs[letter.id]
            (report.completed if key in completed else report.key_taken).append(letter.id)
        else:
            live.add(key)  # a later letter of the key finds it held by this one's job
    return jobs


def _copy_replayed_edges(
    alias: str, own: dict[uuid.UUID, list[_Edge]], jobs: dict[uuid.UUID, NewJob]
) -> tuple[list[Dependency], Counter[uuid.UUID]]:
    """Copy the replayed letters' own edges to their new jobs (docs/workflows.md "Replay").

    A parent finished since (its marker, or no trace left) counts as done; the
    others are found as an enqueue finds them (_find_replayed_parents). A job
    with unfinished parents is written blocked, with the replay's run_at or delay
    for its release. The jobs of the chunk count the copies that wait for their
    keys as dependents. Returns the copies, and the live parents they wait for
    with how many each.
    """
    edges = [edge for letter in jobs for edge in own.get(letter, ())]
    if not edges:
        return [], Counter()
    markers = CompletionMarker.objects.using(alias)
    open_keys = {edge.parent_key for edge in edges if edge.satisfied_at is None}
    finished: set[str] = set()
    for part in _chunks(sorted(open_keys), EXISTS_BATCH):
        finished.update(markers.filter(key__in=part).values_list("key", flat=True))

    def parent_of(edge: _Edge) -> Parent | None:
        if edge.satisfied_at is not None or edge.parent_key in finished:
            return None
        return Parent(id=edge.parent_id, key=edge.parent_key)

    found = _find_replayed_parents(alias, {p for e in edges if (p := parent_of(e)) is not None})
    now = timezone.now()
    copies: list[Dependency] = []
    live: Counter[uuid.UUID] = Counter()
    for letter, job in list(jobs.items()):
        waiting_for = 0
        for edge in own.get(letter, ()):
            parent = parent_of(edge)
            where = found.get(parent) if parent is not None else None
            unfinished = where is not None and where.state != _DONE
            copies.append(
                Dependency(
                    job_id=job.id,
                    parent_key=edge.parent_key,
                    parent_id=edge.parent_id if where is None else where.id,
                    on_parent_dead=edge.on_parent_dead,
                    created_at=now,
                    satisfied_at=None if unfinished else (edge.satisfied_at or now),
                )
            )
            if unfinished:
                waiting_for += 1
            if where is not None and where.state == _LIVE:
                live[where.id] += 1
        if waiting_for:
            # The replay's run_at or delay, if given, apply from its release.
            jobs[letter] = _block(replace(job, waiting_for=waiting_for))
    holder = {job.key: job for job in jobs.values() if job.key is not None}
    for copy in copies:
        if copy.satisfied_at is None and copy.parent_key in holder:
            holder[copy.parent_key].dependents += 1  # a parent replayed in the same chunk
    return copies, live


def _find_replayed_parents(alias: str, parents: Collection[Parent]) -> dict[Parent, _Found | None]:
    """Find the parents of replayed edges as _find_parent does, a few statements per round.

    Each round looks up every parent still unfound by id (_look_by_id) or by key
    (_look_by_key), together; a replayed letter is followed to its replay in the
    next round. It only locks: the caller counts the new dependents of the live
    parents it keeps. None: found nowhere (its marker pruned), which counts as done.
    """
    found: dict[Parent, _Found | None] = {}
    looking: dict[Parent, uuid.UUID | None] = {p: p.id for p in parents}  # None: by key
    for _round in range(2 * DEDUPE_ROUNDS):
        if not looking:
            break
        by_id = {parent: job_id for parent, job_id in looking.items() if job_id is not None}
        by_key = [parent for parent, job_id in looking.items() if job_id is None]
        looking = {}
        # In parts of EXISTS_BATCH: a fan-in step may wait for 100,000 parents.
        for part in _chunks(list(by_id.items()), EXISTS_BATCH):
            looking.update(_look_by_id(alias, dict(part), found))
        for keyed in _chunks(by_key, EXISTS_BATCH):
            looking.update(_look_by_key(alias, keyed, found))
    found.update(dict.fromkeys(looking))  # still moving after every round: as not found
    return found


def _look_by_id(
    alias: str, by_id: Mapping[Parent, uuid.UUID], found: dict[Parent, _Found | None]
) -> dict[Parent, uuid.UUID | None]:
    """Find parents by job id: live (locked), then a marker, then a letter (locked), each
    kind in one statement; return those to look for again (a replay's id, or None: by key)."""
    rest = set(by_id.values())
    live = dict(
        Job.objects.using(alias)
        .filter(id__in=rest)
        .order_by("id")  # locked in id order, as every path that locks several rows
        .select_for_update()
        .values_list("id", "key")
    )
    rest -= live.keys()
    markers = CompletionMarker.objects.using(alias).filter(job_id__in=rest)
    marked = dict(markers.values_list("job_id", "key"))
    rest -= marked.keys()
    dead = {
        letter_id: (key, replay)
        for letter_id, key, replay in DeadLetter.objects.using(alias)
        .filter(id__in=rest)
        .order_by("id")
        .select_for_update()
        .values_list("id", "key", "replay_job_id")
    }
    again: dict[Parent, uuid.UUID | None] = {}
    for parent, job_id in by_id.items():
        if job_id in live:
            own = live[job_id]
            found[parent] = _Found(_LIVE, own if own is not None else str(job_id), job_id)
        elif job_id in marked:
            found[parent] = _Found(_DONE, marked[job_id], job_id)
        elif job_id in dead:
            letter_key, replay = dead[job_id]
            if replay is None:
                key = letter_key if letter_key is not None else str(job_id)
                found[parent] = _Found(_DEAD, key, job_id)
            else:
                again[parent] = replay  # replayed: its replay is the job to wait for
        elif parent.key is not None and job_id == parent.id:
            again[parent] = None  # an id's text given as a string may be a dedupe key too
        else:
            found[parent] = None
    return again


def _look_by_key(
    alias: str, by_key: Sequence[Parent], found: dict[Parent, _Found | None]
) -> dict[Parent, uuid.UUID | None]:
    """Find parents by key: a live holder (locked by id alone, as _find_parent does), then a
    marker, then the latest pending letter (letters locked by id, in id order); return
    those to look for again (every letter of the key replayed: its job is live or done)."""
    jobs = Job.objects.using(alias)
    letters = DeadLetter.objects.using(alias)
    keys = {cast(str, parent.key) for parent in by_key}
    holders: dict[str | None, uuid.UUID] = dict(jobs.filter(key__in=keys).values_list("key", "id"))
    locked = set(
        jobs.filter(id__in=list(holders.values()))
        .order_by("id")
        .select_for_update()
        .values_list("id", flat=True)
    )
    held = {key for key, job_id in holders.items() if job_id in locked}
    markers = CompletionMarker.objects.using(alias).filter(key__in=keys - held)
    marked: dict[str, uuid.UUID] = dict(markers.values_list("key", "job_id"))
    rest = keys - held - marked.keys()
    letter_ids = list(letters.filter(key__in=rest).order_by().values_list("id", flat=True))
    of_key: dict[str | None, list[tuple[datetime, uuid.UUID]]] = {}  # pending ones, by key
    for letter_id, key, replay, dead_at in (
        letters.filter(id__in=letter_ids, key__in=rest)
        .order_by("id")
        .select_for_update()
        .values_list("id", "key", "replay_job_id", "dead_at")
    ):
        of_key.setdefault(key, [])
        if replay is None:
            of_key[key].append((dead_at, letter_id))
    again: dict[Parent, uuid.UUID | None] = {}
    for parent in by_key:
        key = cast(str, parent.key)
        if key in held:
            found[parent] = _Found(_LIVE, key, holders[key])
        elif key in marked:
            found[parent] = _Found(_DONE, key, marked[key])
        elif of_key.get(key):
            latest = max(of_key[key], key=lambda letter: (letter[0], -letter[1].int))
            found[parent] = _Found(_DEAD, key, latest[1])
        elif key in of_key:
            again[parent] = None
        else:
            found[parent] = None
    return again


def _mark_replayed(alias: str, jobs: dict[uuid.UUID, NewJob], by: str) -> None:
    """Mark the letters (locked) as replayed by `by` as their new jobs, and move their steps.

    A step has one row: it moves to the job that runs the step now, so the
    workflow page shows the step once and retention keeps it while that job has
    a record (pruning the letter no longer takes the step with it). Its
    created_at stays: the step keeps its place among its workflow's.
    """
    if _is_postgres(alias):
        letters, new = list(jobs), [job.id for job in jobs.values()]
        sql.run(alias, sql.MARK_REPLAYED, {"by": by, "letters": letters, "jobs": new})
        keys = [job.key for job in jobs.values()]
        sql.run(alias, sql.MOVE_REPLAYED_STEPS, {"letters": letters, "jobs": new, "keys": keys})
        return
    steps = WorkflowStep.objects.using(alias)
    stepped = list(steps.filter(job_id__in=list(jobs)).values_list("job_id", flat=True))
    if stepped:
        steps.filter(job_id__in=stepped).update(
            job_id=_ById(
                "job_id", {letter: jobs[letter].id for letter in stepped}, models.UUIDField()
            ),
            key=_ById(
                "job_id", {letter: jobs[letter].key for letter in stepped}, models.CharField()
            ),
        )
    DeadLetter.objects.using(alias).filter(id__in=list(jobs)).update(
        replayed_at=Now(),
        replayed_by=by,
        replay_job_id=_ById(
            "id", {letter: job.id for letter, job in jobs.items()}, models.UUIDField()
        ),
    )


class _ById(models.Expression):
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


def _letter_fingerprint(letter: _Letter) -> str | None:
    if letter.fingerprint is not None:
        return letter.fingerprint
    try:
        return payload_fingerprint(letter.name, letter.payload)
    except ValueError:  # a hand-edited payload that is no JSON: no fingerprint to compare
        return None


class _IdAsKey(models.Func):
    """A UUID column as the text an edge names a keyless parent by (str(uuid))."""

    output_field = models.CharField()
    template = "CAST(%(expressions)s AS text)"  # PostgreSQL: the hyphenated form

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Stored as 32 hex digits: put the hyphens back.
        parts = "||'-'||".join(
            f"substr(%(expressions)s, {start}, {length})"
            for start, length in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))
        )
        return self.as_sql(compiler, connection, template=parts, **extra)

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # char(32) hex, or MariaDB's native uuid (hyphenated): strip, then hyphenate.
        template = "REPLACE(CAST(%(expressions)s AS char), '-', '')"
        for at in (9, 14, 19, 24):
            template = f"INSERT({template}, {at}, 0, '-')"
        return self.as_sql(compiler, connection, template=template, **extra)


def letter_edge_key(ref: Callable[[str], Any] = F) -> Coalesce:
    """The key its dependents' edges name a letter by, in SQL: its key, or its id as text.

    `ref` is F for the letter's own row, OuterRef from a subquery.
    """
    return Coalesce(ref("key"), _IdAsKey(ref("id")), output_field=models.CharField())


class DeadLetterQuerySet(models.QuerySet["DeadLetter"]):
    """Named reads and state changes of dead letters."""

    def pending(self) -> DeadLetterQuerySet:
        """Letters not replayed yet."""
        return self.filter(replayed_at__isnull=True)

    def waited_for(self, besides: models.QuerySet[DeadLetter] | None = None) -> DeadLetterQuerySet:
        """The pending letters something waits for, with how many live jobs (`waiting`)
        and pending letters (`waiting_letters`) do.

        Every unsatisfied edge counts, whatever its on_parent_dead (a replayed
        "dead" step waits again): only the letter's replay, once it completes,
        releases them. A waiting job's own letter (cancelled, or dead with its
        parent) counts too: replayed, it waits again, and with no trace of this
        parent left it would run as if it had finished. Letters of `besides` (those
        deleted together) do not count. One query, its counts along the
        parent_key index.
        """
        alias = self.db
        live = Job.objects.using(alias).filter(id=OuterRef("job_id"))
        letters = DeadLetter.objects.using(alias).pending().filter(id=OuterRef("job_id"))
        if besides is not None:
            letters = letters.exclude(id__in=besides.values("id"))

        def waiters(of: models.QuerySet[Any]) -> Subquery:
            edges = (
                Dependency.objects.using(alias)
                .filter(Exists(of), satisfied_at__isnull=True, parent_key=letter_edge_key(OuterRef))
                .order_by()
                .annotate(count=models.Func(F("id"), function="COUNT"))
                .values("count")
            )
            return Subquery(edges, output_field=models.IntegerField())

        return (
            self.pending()
            .annotate(waiting=waiters(live), waiting_letters=waiters(letters))
            .filter(Q(waiting__gt=0) | Q(waiting_letters__gt=0))
        )

    def replay(
        self,
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
        a live job holds, or whose key's work has completed since, is not replayed.
        Letters are replayed REPLAY_BATCH at a time, each batch in one transaction
        of a few statements whatever its size (_replay_letters);
        `progress(done, total)` is called after each batch.
        """
        if run_at is not None and delay is not None:
            raise ValueError("pass run_at or delay, not both")
        if run_at is not None:
            limits.run_time("run_at", run_at)
        alias = self.db
        seconds = 0.0
        if delay is not None:
            seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
            seconds = limits.seconds("delay", seconds, zero=True)
        report = ReplayReport()
        ids = list(self.values_list("id", flat=True))
        done = 0
        size = REPLAY_BATCH
        if limit := connections[alias].features.max_query_params:
            size = max(1, min(size, limit // 3))  # SQLite: a CASE of 2 per letter, an IN of 1
        # Each new job due now wakes listening workers at commit (see JobQuerySet.insert).
        for chunk in _chunks(ids, size):
            report.add(_replay_chunk(alias, chunk, by, run_at, seconds))
            done += len(chunk)
            if progress is not None:
                progress(done, len(ids))
        return report


class Job(models.Model):
    """A job that has not finished: waiting, scheduled for later, or leased to a worker."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    name = models.CharField(max_length=MAX_NAME_LENGTH)
    queue = models.CharField(max_length=MAX_QUEUE_LENGTH, default="default")
    payload = models.TextField(help_text=_("JSON text, exactly as enqueued."))
    priority = models.SmallIntegerField(default=0, help_text=_("-100..100; higher runs first."))
    run_at = models.DateTimeField(help_text=_("Not claimed before this time."))
    enqueued_at = models.DateTimeField()
    attempts = models.IntegerField(default=0, help_text=_("Attempts started, counted at claim."))
    max_attempts = models.IntegerField()
    key = models.CharField(
        max_length=MAX_KEY_LENGTH, null=True, blank=True, help_text=_("Dedupe key.")
    )
    fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH, null=True, blank=True)
    locked_by = models.CharField(
        max_length=MAX_TOKEN_LENGTH,
        null=True,
        blank=True,
        help_text=_("Lease token: worker id and claim."),
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text=_("First attempt."))
    attempted_at = models.DateTimeField(null=True, blank=True, help_text=_("Latest attempt."))
    errors = models.JSONField(default=list, blank=True, help_text=_("Errors of earlier attempts."))
    cancel_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_("Cancellation asked for; the worker sees it at its next heartbeat."),
    )
    partition = models.CharField(
        max_length=flow.MAX_PARTITION_LENGTH,
        null=True,
        blank=True,
        help_text=_("Flow control's partition value, from the handler's partition_by."),
    )
    # Workflows (docs/workflows.md). db_default: rows written by raw SQL, or by a
    # worker of an earlier release during a deploy, get 0 without naming the columns.
    waiting_for = models.IntegerField(
        default=0,
        db_default=0,
        help_text=_("Parents not finished yet; while above 0 the job is blocked."),
    )
    dependents = models.IntegerField(
        default=0,
        db_default=0,
        help_text=_("Jobs registered as waiting for this one (their settle releases them)."),
    )
    # A blocked job's own delay or run_at, applied when its last parent finishes
    # (sql._release, JobQuerySet.release_dependents). NULL, as in rows written by
    # raw SQL or by an earlier release during a deploy: due at once when released.
    release_delay = models.DurationField(
        null=True,
        blank=True,
        help_text=_("After its parents finish, the job waits this long before it is due."),
    )
    not_before = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_("After its parents finish, the job is not due before this time."),
    )
    trace_context = models.CharField(
        max_length=MAX_TRACE_CONTEXT_LENGTH,
        null=True,
        blank=True,
        help_text=_("W3C traceparent (and tracestate) of the span that enqueued it."),
    )
    progress = models.JSONField(
        null=True, blank=True, help_text=_("The running attempt's last ctx.progress().")
    )
    tags = models.JSONField(null=True, blank=True, help_text=_("Tags to filter by (a list)."))
    meta = models.JSONField(null=True, blank=True, help_text=_("Metadata to filter by (a dict)."))

    objects = JobsDatabaseManager.from_queryset(JobQuerySet)()

    class Meta:
        db_table = "django_jobs_job"
        ordering = ["-priority", "run_at", "id"]
        permissions = [
            ("run_job_now", "Can make scheduled jobs due now"),
            (
                "cancel_job",
                "Can cancel jobs (waiting ones are dead-lettered, running ones stopped)",
            ),
        ]
        indexes = [
            # Matches sql.CLAIM exactly: one queue, unleased, in claim order.
            models.Index(
                fields=["queue", "-priority", "run_at", "id"],
                condition=Q(locked_by__isnull=True),
                name="django_jobs_job_claim",
            ),
            # Finds a queue's expired leases without scanning waiting jobs.
            models.Index(
                fields=["queue", "lease_expires_at"],
                condition=Q(locked_by__isnull=False),
                name="django_jobs_job_lease",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["key"], condition=Q(key__isnull=False), name="django_jobs_job_key_unique"
            ),
            models.CheckConstraint(condition=Q(attempts__gte=0), name="django_jobs_job_attempts"),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="django_jobs_job_max_attempts"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=MIN_PRIORITY, priority__lte=MAX_PRIORITY),
                name="django_jobs_job_priority",
            ),
            models.CheckConstraint(
                condition=Q(locked_by__isnull=True, lease_expires_at__isnull=True)
                | Q(locked_by__isnull=False, lease_expires_at__isnull=False),
                name="django_jobs_job_lease_pair",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.id}"

    @classmethod
    def check(cls, **kwargs: Any) -> list[CheckMessage]:
        return _covered_partial_index_warnings(super().check(**kwargs), kwargs.get("databases"))

    @property
    def idempotency_key(self) -> str:
        return self.key if self.key is not None else str(self.id)


class FlowWindowQuerySet(models.QuerySet["FlowWindow"]):
    def prune_ended(self) -> int:
        """Delete the counters of windows that ended long ago (flow.KEEP_ENDED_WINDOWS).

        The claim reads only its current window's row and starts a new window
        with a fresh count, so such a row is dead weight: a group or partition
        that stopped starting jobs, or a limit since removed. A claim that starts
        the group's window meanwhile moves its row forward (the delete re-checks
        its age on the locked row) or inserts a new one. Returns the rows deleted.
        """
        deleted, _ = self.filter(window_start__lt=Now() - flow.KEEP_ENDED_WINDOWS).delete()
        return deleted


class FlowWindow(models.Model):
    """Starts of one rate-limited group (and partition) in its current fixed window."""

    key = models.CharField(max_length=MAX_NAME_LENGTH + 10, help_text=_("The limited group."))
    partition = models.CharField(max_length=flow.MAX_PARTITION_LENGTH, default="", blank=True)
    window_start = models.DateTimeField()
    starts = models.IntegerField(default=0)

    objects = JobsDatabaseManager.from_queryset(FlowWindowQuerySet)()

    class Meta:
        db_table = "django_jobs_flow_window"
        constraints = [
            models.UniqueConstraint(
                fields=["key", "partition"], name="django_jobs_flow_window_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} {self.partition}"


class OnParentDead(models.TextChoices):
    """What a workflow step does when a job it waits for is dead-lettered."""

    WAIT = "wait", _("wait (until the parent's letter is replayed and succeeds)")
    DEAD = "dead", _("dead-letter it too (reason parent_dead)")


class Dependency(models.Model):
    """One edge of a workflow: job `job_id` waits until the work of `parent_key` is done.

    `parent_key` is the parent's idempotency key (its dedupe key, or its id as
    text), the key its completion marker is written under. `satisfied_at` is set
    in the transaction that writes that marker, which also counts down the
    dependent's `Job.waiting_for`. Rows are kept after that: they are the graph
    the workflow page draws and what `ctx.parent_results` reads.
    """

    id = models.BigAutoField(primary_key=True)
    job_id = models.UUIDField(help_text=_("The waiting job (its letter's id if it died)."))
    parent_key = models.CharField(
        max_length=MAX_KEY_LENGTH, help_text=_("The parent's dedupe key, or its id.")
    )
    parent_id = models.UUIDField(help_text=_("The parent's job id when the edge was written."))
    on_parent_dead = models.CharField(
        max_length=8, choices=OnParentDead.choices, default=OnParentDead.WAIT
    )
    created_at = models.DateTimeField()
    satisfied_at = models.DateTimeField(
        null=True, blank=True, help_text=_("When the parent's completion marker was written.")
    )

    objects = JobsDatabaseManager()

    class Meta:
        db_table = "django_jobs_dependency"
        verbose_name_plural = _("dependencies")
        indexes = [
            models.Index(fields=["job_id"], name="django_jobs_dependency_job"),
            # The settle of a parent finds the edges it releases by key.
            models.Index(fields=["parent_key"], name="django_jobs_dependency_parent"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["job_id", "parent_key"], name="django_jobs_dependency_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} after {self.parent_key}"


class WorkflowStep(models.Model):
    """A job written by `workflow(name=...)`: the workflow page and cancel find steps here."""

    job_id = models.UUIDField(primary_key=True, help_text=_("The step's job id."))
    workflow = models.CharField(max_length=MAX_KEY_LENGTH)
    name = models.CharField(max_length=MAX_NAME_LENGTH, help_text=_("The step's handler."))
    key = models.CharField(max_length=MAX_KEY_LENGTH, null=True, blank=True)
    created_at = models.DateTimeField()

    objects = JobsDatabaseManager()

    class Meta:
        db_table = "django_jobs_workflow_step"
        ordering = ["workflow", "created_at", "job_id"]
        # The admin lists workflows (steps grouped by name) under this model's entry.
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        indexes = [
            models.Index(fields=["workflow", "created_at"], name="django_jobs_step_workflow"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow}: {self.name} {self.job_id}"


class CompletionMarker(models.Model):
    """Proof that the work of an idempotency key is done: it will not run again."""

    job_id = models.UUIDField(primary_key=True, help_text=_("Id of the job that finished."))
    key = models.CharField(max_length=MAX_KEY_LENGTH, help_text=_("Dedupe key, or the job id."))
    name = models.CharField(max_length=MAX_NAME_LENGTH)
    queue = models.CharField(max_length=MAX_QUEUE_LENGTH)
    attempts = models.IntegerField(default=1)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField()
    worker_id = models.CharField(max_length=MAX_TOKEN_LENGTH, blank=True, default="")
    result = models.JSONField(null=True, blank=True, help_text=_("The handler's return value."))
    fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH, null=True, blank=True)
    progress = models.JSONField(null=True, blank=True, help_text=_("The last ctx.progress()."))

    objects = JobsDatabaseManager()

    class Meta:
        db_table = "django_jobs_marker"
        ordering = ["-completed_at"]
        indexes = [models.Index(fields=["completed_at"], name="django_jobs_marker_completed")]
        constraints = [
            models.UniqueConstraint(fields=["key"], name="django_jobs_marker_key_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.key}"


class DeadLetter(models.Model):
    """A job that will not run again unless replayed, with why and every attempt's error."""

    id = models.UUIDField(primary_key=True, help_text=_("Id of the job that died."))
    name = models.CharField(max_length=MAX_NAME_LENGTH)
    queue = models.CharField(max_length=MAX_QUEUE_LENGTH)
    payload = models.TextField()
    priority = models.SmallIntegerField(default=0)
    key = models.CharField(max_length=MAX_KEY_LENGTH, null=True, blank=True)
    fingerprint = models.CharField(max_length=FINGERPRINT_LENGTH, null=True, blank=True)
    attempts = models.IntegerField()
    max_attempts = models.IntegerField()
    reason = models.CharField(max_length=32, choices=DeadReason.choices)
    error = models.TextField(blank=True, help_text=_("The last error, one line."))
    traceback = models.TextField(blank=True)
    errors = models.JSONField(default=list, blank=True, help_text=_("Every attempt's error."))
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField()
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.CharField(max_length=MAX_BY_LENGTH, blank=True, default="")
    replay_job_id = models.UUIDField(null=True, blank=True)
    trace_context = models.CharField(
        max_length=MAX_TRACE_CONTEXT_LENGTH,
        null=True,
        blank=True,
        help_text=_("W3C traceparent (and tracestate) of the span that enqueued the job."),
    )
    progress = models.JSONField(null=True, blank=True, help_text=_("The last ctx.progress()."))
    tags = models.JSONField(null=True, blank=True, help_text=_("Tags to filter by (a list)."))
    meta = models.JSONField(null=True, blank=True, help_text=_("Metadata to filter by (a dict)."))

    objects = JobsDatabaseManager.from_queryset(DeadLetterQuerySet)()

    class Meta:
        db_table = "django_jobs_deadletter"
        ordering = ["-dead_at"]
        permissions = [("replay_deadletter", "Can replay dead letters")]
        indexes = [
            models.Index(fields=["dead_at"], name="django_jobs_dead_dead_at"),
            models.Index(fields=["enqueued_at"], name="django_jobs_dead_enqueued_at"),
            # A parent named by key found dead (after=, _find_parent), and the admin's search
            # by key. Not partial: MariaDB has no partial indexes.
            models.Index(fields=["key"], name="django_jobs_dead_key"),
            # The admin links a replayed job (or its marker) back to its letter.
            models.Index(
                fields=["replay_job_id"],
                condition=Q(replay_job_id__isnull=False),
                name="django_jobs_dead_replay_job",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(replayed_at__isnull=True) | Q(replay_job_id__isnull=False),
                name="django_jobs_dead_replay_pair",
            ),
        ]

    def __str__(self) -> str:
        # The reason's label read directly: get_reason_display() rebuilds the choices' map
        # at each call, which the admin's log of a replay of 10,000 letters calls each.
        reason = DeadReason(self.reason).label if self.reason in DeadReason else self.reason
        return f"{self.name} {self.id} ({reason})"

    @classmethod
    def check(cls, **kwargs: Any) -> list[CheckMessage]:
        return _covered_partial_index_warnings(super().check(**kwargs), kwargs.get("databases"))

    @classmethod
    def for_job(
        cls,
        job: Job | ClaimedJob,
        *,
        reason: str,
        error: dict[str, Any],
        attempts: int | None = None,
        dead_at: datetime | None = None,
    ) -> DeadLetter:
        """Return (unsaved) the letter of a job that dies with `error` as its last one."""
        return cls(
            id=job.id,
            **definition(job),
            attempts=job.attempts if attempts is None else attempts,
            reason=reason,
            # Texts made storable here too: a letter is the record that must always commit.
            error=storable_text(error_summary(error), MAX_LABEL + MAX_MESSAGE + 64),
            traceback=storable_text(error.get("traceback", "")),
            errors=[*usable_errors(job.errors), error],
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            dead_at=dead_at or timezone.now(),
            progress=job.progress,
        )

    @property
    def is_replayed(self) -> bool:
        return self.replayed_at is not None


class RunningJob(Job):
    """The jobs workers hold right now: the admin's view for cancelling them."""

    class Meta:
        proxy = True
        verbose_name = _("running job")
