"""The ORM engine: each state change as Django's ORM runs it (SQLite; MySQL and MariaDB
through mysql.MySQL, which adds their quirks; PostgreSQL with DJANGO_JOBS["CLAIM"] = "orm").

Every method is the engine's half of a state change whose other half (what all
engines share) is in the concern module named in its docstring.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.db import IntegrityError, NotSupportedError, connections, models, transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Greatest, Now
from django.utils import timezone

from django_jobs.attempts import lease_expired_entry, worker_of
from django_jobs.exceptions import LeaseLost
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Dependency,
    JobQuerySet,
    QueueState,
    WorkerBeat,
    WorkflowStep,
    released_run_at,
)
from django_jobs.rows import (
    Beat,
    ClaimedJob,
    ClaimRequest,
    EnqueueResult,
    Finished,
    NewJob,
    Settled,
)
from django_jobs.store import aging
from django_jobs.store.base import (
    BULK_BATCH,
    EDGE_BATCH,
    ById,
    Holder,
    KeyRaced,
    WorkflowRows,
    edge,
    json_loads,
    new_row,
)

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
)


class _KeyCompleted(Exception):
    """Rolls back an insert whose key's marker appeared meanwhile (Portable.insert_keyed)."""

    def __init__(self, marker: tuple[uuid.UUID, str | None]) -> None:
        self.marker = marker


def write_beat(alias: str, beat: Beat) -> None:
    """Refresh the worker's heartbeat row the ORM way (sql.CLAIM does it inside the claim)."""
    WorkerBeat.objects.using(alias).filter(id=beat.worker).update(
        last_seen_at=Now(),
        running=beat.running,
        **({"stats": json.loads(beat.stats)} if beat.stats else {}),
    )


def family(jobs: JobQuerySet, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """What the ORM's settle of ids locks first (sql._lock_family with crossed_only).

    The jobs it may release whose ids sort before the batch's last, with the batch
    up to it; none when there are no such jobs: locking the batch then the
    released jobs keeps id order then.
    """
    keys = [
        key if key is not None else str(job_id)
        for job_id, key in jobs.filter(id__in=ids, dependents__gt=0).values_list("id", "key")
    ]
    if not keys:
        return list(ids)
    edges = Dependency.objects.using(jobs.db).filter(parent_key__in=keys, satisfied_at__isnull=True)
    last = max(ids)
    early = [job_id for job_id in edges.values_list("job_id", flat=True) if job_id < last]
    return sorted({*ids, *early}) if early else []


class Portable:
    """The ORM engine (SQLite as it is; the base of MySQL and Postgres)."""

    # A deadlock's victim inside the caller's transaction can be tried again in place
    # only where a savepoint's rollback releases the locks it took (PostgreSQL).
    retries_inside_transaction = False
    # What the layers above ask instead of the database's vendor:
    # flow limits (global_concurrency, rate_limit) counted and claimed under a lock,
    enforces_limits = False
    # a cheap row-count estimate (the planner's) for the admin's long lists,
    estimates_counts = False
    # LISTEN/NOTIFY wake-ups for idle workers,
    listens = False
    # a VACUUM to make deleted rows' space reusable (the worker's upkeep runs it).
    vacuums = False

    def claims_safely(self, alias: str) -> bool:
        """Whether workers on several connections can share this database's claims.

        SQLite has one writer at a time; other engines need SKIP LOCKED.
        """
        connection = connections[alias]
        return connection.vendor == "sqlite" or bool(
            connection.features.has_select_for_update_skip_locked
        )

    def transaction_aborted(self, alias: str) -> bool:
        """Whether alias's open transaction refuses every statement until rolled back.

        Only PostgreSQL aborts a transaction on a failed statement; the others go on.
        """
        return False

    def refused(self, exc: BaseException) -> bool:
        """Whether exc, an OperationalError, refused the statement (not a lost connection)."""
        return False

    def dropped_connection(self, exc: BaseException) -> bool:
        """Whether the server closed the connection after refusing the statement (exc)."""
        return False

    def clock(self, alias: str) -> datetime:
        """The database's clock, aware in UTC (SQLite's is the host's)."""
        return datetime.now(UTC)

    # ---- what the engine is asked in passing -------------------------------

    def now(self, alias: str) -> datetime:
        """The time a bulk write stamps its rows with."""
        return timezone.now()

    def notify(self, alias: str, queues: Iterable[str]) -> None:
        """Wake listening workers of queues at commit (only PostgreSQL listens)."""

    def notify_freed(self, alias: str, keys: Iterable[str]) -> None:
        """Tell listening workers that slots of limited groups freed (only PostgreSQL)."""

    def refuse_oversized(self, alias: str, jobs: Sequence[NewJob]) -> None:
        """Raise InvalidPayload for a payload the server would refuse (MySQL only)."""

    def batches(self, alias: str, jobs: list[NewJob]) -> list[list[NewJob]]:
        """Split jobs into bulk_create batches of BULK_BATCH rows."""
        return [jobs[i : i + BULK_BATCH] for i in range(0, len(jobs), BULK_BATCH)]

    def delete_locked(self, queryset: models.QuerySet[Any]) -> int:
        """Delete queryset's rows, which this transaction holds locked; return how many."""
        return queryset.delete()[0]

    def lock_due(self, jobs: JobQuerySet, due: JobQuerySet, wanted: int) -> list[uuid.UUID]:
        """The ids of up to `wanted` of `due`'s jobs, locked when `due` locks (the claim)."""
        return list(due.values_list("id", flat=True)[:wanted])

    def pick_due(self, jobs: JobQuerySet, due: JobQuerySet, wanted: int) -> list[uuid.UUID]:
        """The due jobs a claim leases: lock_due's, or with priority aging on, those of the
        highest effective priority (store/aging.py) locked by id, topped up by lock_due's
        when another claim in flight held some of them (they were read unlocked)."""
        if (seconds := aging.step()) is None:
            return self.lock_due(jobs, due, wanted)
        taken = self.lock_ids(jobs, aging.due_ids(due, wanted, seconds))
        if len(taken) < wanted:  # a claim in flight held some: the next due ones, unaged
            taken += self.lock_due(jobs, due.exclude(id__in=taken), wanted - len(taken))
        return taken

    def lock_ids(self, jobs: JobQuerySet, ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """Those of `ids` still due and unleased, locked when `jobs` locks (aging's claim)."""
        return list(
            jobs.filter(id__in=ids, locked_by__isnull=True, run_at__lte=Now()).values_list(
                "id", flat=True
            )
        )

    # ---- enqueue (store/enqueue.py) ------------------------------------------

    def insert_plain(self, jobs: JobQuerySet, job: NewJob) -> EnqueueResult:
        """Write a job without a key."""
        alias = jobs.db
        self.refuse_oversized(alias, [job])
        now = timezone.now()
        new_row(job, now).save(using=alias, force_insert=True)
        return EnqueueResult(job.id, False, job.name, job.queue, now, jobs.db)

    def insert_keyed(self, jobs: JobQuerySet, job: NewJob) -> Holder | None:
        """Insert a job with a key once, or find the marker of its key; None: a live job
        may hold it (enqueue.insert looks)."""
        alias = jobs.db
        self.refuse_oversized(alias, [job])
        markers = CompletionMarker.objects.using(alias)
        done = markers.filter(key=job.key).values_list("job_id", "fingerprint").first()
        if done is not None:
            return Holder("completed", *done, None)
        now = timezone.now()
        # Jobs waiting for the key already (after= a dead letter of it): see INSERT_KEYED.
        waiting = Dependency.objects.using(alias).filter(
            parent_key=job.key, satisfied_at__isnull=True
        )
        row = new_row(job, now)
        row.dependents = waiting.count()
        try:
            with transaction.atomic(using=alias):
                row.save(using=alias, force_insert=True)
                # The insert may have waited for a live job of the key to settle
                # (its marker written after the look above): look again.
                again = markers.filter(key=job.key).values_list("job_id", "fingerprint")
                if (late := again.first()) is not None:
                    raise _KeyCompleted(late)
            return Holder("inserted", job.id, None, now)
        except _KeyCompleted as completed:
            return Holder("completed", *completed.marker, None)
        except IntegrityError:
            return None  # a live job holds the key

    def insert_many(self, jobs: JobQuerySet, plain: list[NewJob], every: list[NewJob]) -> datetime:
        """Write the jobs without a key of an enqueue_many (`every`: all of its jobs)."""
        alias = jobs.db
        now = timezone.now()
        self.refuse_oversized(alias, every)
        for batch in self.batches(alias, plain):
            jobs.bulk_create([new_row(job, now) for job in batch])
        return now

    def insert_replays(self, jobs: JobQuerySet, new: Sequence[NewJob]) -> None:
        """Write the new jobs of a replay chunk (store/replay.py), all or none."""
        alias = jobs.db
        keys = [job.key for job in new if job.key is not None]
        markers = CompletionMarker.objects.using(alias)
        now = timezone.now()
        try:
            with transaction.atomic(using=alias):
                jobs.bulk_create([new_row(job, now) for job in new], batch_size=BULK_BATCH)
        except IntegrityError:
            if jobs.filter(key__in=keys).exists() or markers.filter(key__in=keys).exists():
                raise KeyRaced from None  # a live job of a key came in since the look
            raise
        # The insert may have waited for a live job of a key to settle: its marker
        # was written after the look (as insert_keyed looks again).
        if keys and markers.filter(key__in=keys).exists():
            raise KeyRaced

    def write_workflow(self, jobs: JobQuerySet, steps: WorkflowRows) -> None:
        """Write a workflow's unkeyed steps, its edges and its step rows (store/workflows.py)."""
        alias, now = jobs.db, steps.now
        self.refuse_oversized(alias, steps.plain)
        for batch in self.batches(alias, steps.plain):
            jobs.bulk_create([new_row(job, now) for job in batch])
        Dependency.objects.using(alias).bulk_create(
            [edge(job_id, f, mode, now) for job_id, f, mode in steps.edges],
            batch_size=EDGE_BATCH,
        )
        WorkflowStep.objects.using(alias).bulk_create(
            [
                WorkflowStep(
                    job_id=job.id,
                    workflow=steps.workflow,
                    name=job.name,
                    key=job.key,
                    created_at=now,
                )
                for job in steps.written
            ],
            batch_size=EDGE_BATCH,
        )

    # ---- claim (store/claim.py) ---------------------------------------------

    def claim(self, jobs: JobQuerySet, request: ClaimRequest) -> list[ClaimedJob]:
        """Lease jobs without flow limits: the ORM claim."""
        alias = jobs.db
        if request.beat is not None:
            write_beat(alias, request.beat)
        if request.limit <= 0:
            return []
        if not connections[alias].features.has_select_for_update_skip_locked:
            return self.claim_rows(jobs, request)
        # The ORM claim: the same steps, each selection locking its rows and
        # skipping those another claim holds, all in one transaction.
        with transaction.atomic(using=alias):
            return self.claim_rows(jobs.select_for_update(skip_locked=True), request)

    def claim_flow(
        self, jobs: JobQuerySet, request: ClaimRequest, finished: Sequence[Finished] = ()
    ) -> tuple[Settled, list[ClaimedJob]]:
        """Claim within flow limits: PostgreSQL only (docs/flow-control.md)."""
        raise NotSupportedError("flow limits need PostgreSQL")

    def claim_rows(
        self, jobs: JobQuerySet, request: ClaimRequest, limited: Sequence[str] = ()
    ) -> list[ClaimedJob]:
        """The ORM claim's steps: expired leases first, then due jobs (`limited`: names
        claimed within their limits, left out)."""
        # Conditional UPDATEs: on SQLite each takes the write lock at once, and
        # re-checking the lease in the UPDATE keeps two workers from taking one row.
        alias, token, limit = jobs.db, request.token, request.limit
        paused = set(
            QueueState.objects.using(alias).filter(paused=True).values_list("name", flat=True)
        )
        queues = [q for q in request.queues if q not in paused]
        now = Now()
        lease_until = now + timedelta(seconds=request.lease)
        attempted: list[uuid.UUID] = []
        names = request.names
        known = jobs if names is None else jobs.filter(name__in=list(names))
        if limited:  # claimed within their limits by claim_flow
            known = known.exclude(name__in=list(limited))
        expired = (
            known.filter(locked_by__isnull=False, queue__in=list(queues), lease_expires_at__lt=now)
            .order_by("lease_expires_at")
            .values_list("id", "locked_by", "attempts", "errors")[:limit]
        )
        for job_id, locked_by, attempts, errors in expired:
            # locked_by__isnull=False above: the lease's token.
            entry = lease_expired_entry(attempts, cast(str, locked_by), timezone.now())
            jobs.filter(id=job_id, locked_by=locked_by, lease_expires_at__lt=now).update(
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
                .exclude(name__in=list(request.exclude_names))
                .order_by("-priority", "run_at", "id")
            )
            candidates = self.pick_due(jobs, due, limit - len(attempted))
            jobs.filter(id__in=candidates, locked_by__isnull=True).update(
                attempts=F("attempts") + 1,
                locked_by=token,
                lease_expires_at=lease_until,
                attempted_at=now,
                started_at=Coalesce("started_at", now),
            )
            attempted += candidates
        rows = (
            jobs.filter(id__in=attempted, locked_by=token)
            .order_by("-priority", "run_at", "id")
            .values_list(*_CLAIMED_FIELDS)
        )
        # A row holds the twelve fields before token, then dependents: mypy cannot count them.
        claimed = [
            ClaimedJob(  # type: ignore[misc]
                *row[:12],
                token=token,
                dependents=row[12],
                run_at=row[13],
                trace_context=row[14],
            )
            for row in rows
        ]
        keys = {j.idempotency_key for j in claimed if j.key is not None or j.attempts > 1}
        if keys:
            done = set(
                CompletionMarker.objects.using(alias)
                .filter(key__in=keys)
                .values_list("key", flat=True)
            )
            for job in claimed:
                job.completed = job.idempotency_key in done
        return claimed

    # ---- settle (store/settle.py) -------------------------------------------

    def complete(self, jobs: JobQuerySet, finished: Sequence[Finished]) -> Settled:
        """Settle finished jobs as done: delete each row, write its marker, release its waiters."""
        alias = jobs.db
        token_of = {job.id: (job.token, job.result) for job in finished}
        with transaction.atomic(using=alias):
            # Locking reads: MariaDB's plain SELECT reads the transaction's old
            # snapshot, which may not count a dependent registered since.
            if any(job.dependents for job in finished):
                # With the jobs it may release, in id order, when theirs cross.
                first = family(jobs, list(token_of))
                list(jobs.select_for_update().filter(id__in=first).order_by("id"))
            rows = list(
                jobs.select_for_update()
                .filter(id__in=list(token_of))
                .order_by("id")
                .values_list(*_CLAIMED_FIELDS, "progress", "locked_by")
            )
            held = [row for row in rows if row[-1] == token_of[row[0]][0]]
            if not held:
                return Settled()
            self.delete_locked(
                jobs.filter(
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
                        result=json_loads(token_of[row[0]][1]),
                        fingerprint=row[8],
                        progress=row[-2],
                    )
                    for row in held
                ],
                ignore_conflicts=True,
            )
            keys = [row[7] if row[7] is not None else str(row[0]) for row in held if row[12]]
            woke = bool(keys) and self.release_dependents(jobs, keys) > 0
        ids = {row[0] for row in held}
        settled = Settled(index for index, job in enumerate(finished) if job.id in ids)
        settled.woke = woke
        return settled

    def complete_atomically(self, jobs: JobQuerySet, job: ClaimedJob, result: str | None) -> bool:
        """Inside the handler's transaction: delete the job, write its marker (store/settle.py)."""
        alias = jobs.db
        # A locking read: the count as it is now (see complete()).
        if job.dependents:
            list(jobs.select_for_update().filter(id__in=family(jobs, [job.id])).order_by("id"))
        dependents = (
            jobs.select_for_update()
            .filter(id=job.id, locked_by=job.token)
            .values_list("dependents", flat=True)
            .first()
        )
        if dependents is None or not jobs.filter(id=job.id, locked_by=job.token).delete()[0]:
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
            result=json_loads(result),
            fingerprint=job.fingerprint,
            progress=job.progress,
        )
        try:
            with transaction.atomic(using=alias):
                marker.save(using=alias, force_insert=True)
        except IntegrityError:
            return False
        if dependents:
            self.release_dependents(jobs, [job.idempotency_key])
        return True

    def release_dependents(self, jobs: JobQuerySet, keys: Sequence[str]) -> int:
        """Satisfy the open edges on parent `keys`, count their jobs down, release those at 0
        (store/settle.py); return how many are due now."""
        alias = jobs.db
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
                jobs.select_for_update()
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
                jobs.filter(id__in=ids).update(waiting_for=F("waiting_for") - n)
            if due:
                jobs.filter(id__in=due).update(run_at=released_run_at())
            self.notify(alias, queues)
        return due_now

    def extend(
        self, jobs: JobQuerySet, ids: list[uuid.UUID], tokens: list[str], seconds: float
    ) -> dict[uuid.UUID, bool]:
        """Push leases ahead; return the jobs held, each with whether its cancel was asked."""
        leased = jobs.filter(id__in=ids, locked_by__in=tokens)
        leased.update(
            lease_expires_at=Greatest("lease_expires_at", Now() + timedelta(seconds=seconds))
        )
        return {
            job_id: requested is not None
            for job_id, requested in leased.values_list("id", "cancel_requested_at")
        }

    # ---- replay (store/replay.py) -------------------------------------------

    def mark_replayed(self, alias: str, jobs: dict[uuid.UUID, NewJob], by: str) -> None:
        """Mark the letters (locked) as replayed by `by` as their new jobs, and move their steps."""
        steps = WorkflowStep.objects.using(alias)
        stepped = list(steps.filter(job_id__in=list(jobs)).values_list("job_id", flat=True))
        if stepped:
            steps.filter(job_id__in=stepped).update(
                job_id=ById(
                    "job_id", {letter: jobs[letter].id for letter in stepped}, models.UUIDField()
                ),
                key=ById(
                    "job_id", {letter: jobs[letter].key for letter in stepped}, models.CharField()
                ),
            )
        DeadLetter.objects.using(alias).filter(id__in=list(jobs)).update(
            replayed_at=Now(),
            replayed_by=by,
            replay_job_id=ById(
                "id", {letter: job.id for letter, job in jobs.items()}, models.UUIDField()
            ),
        )
