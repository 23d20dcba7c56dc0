"""PostgreSQL: each hot state change as one statement of sql.py (one round trip).

The engine's half of insert, claim (and the flow-limited claim), complete,
complete_atomically, release, extend and a replay's writes; bulk writes go in by
COPY. DJANGO_JOBS["CLAIM"] = "orm" runs the claim the ORM way (Portable's).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, transaction

from django_jobs import conf, flow
from django_jobs.exceptions import LeaseLost
from django_jobs.models import CompletionMarker, JobQuerySet
from django_jobs.rows import ClaimedJob, ClaimRequest, EnqueueResult, Finished, NewJob, Settled
from django_jobs.store import aging, pgrun, sliding, sql
from django_jobs.store.base import DONE, Found, Holder, KeyRaced, WorkflowRows, json_text
from django_jobs.store.portable import Portable, write_beat

# A settle batch with the positions of its jobs in the worker's list.
Batch = list[tuple[int, Finished]]


class Postgres(Portable):
    """PostgreSQL (psycopg 3): the one-statement paths."""

    retries_inside_transaction = True  # a savepoint's rollback releases its row locks
    enforces_limits = True  # advisory locks and store.sql.CLAIM_LIMITED
    estimates_counts = True  # EXPLAIN's row estimate
    listens = True  # LISTEN/NOTIFY
    vacuums = True  # deleted rows' space is reused only after a VACUUM

    def claims_safely(self, alias: str) -> bool:
        return True

    def transaction_aborted(self, alias: str) -> bool:
        raw = connections[alias].connection
        if raw is None:
            return False
        from psycopg.pq import TransactionStatus

        return bool(raw.info.transaction_status == TransactionStatus.INERROR)

    def clock(self, alias: str) -> datetime:
        return self.now(alias).astimezone(UTC)

    def now(self, alias: str) -> datetime:
        return pgrun.run(alias, "SELECT statement_timestamp()")[0][0]  # type: ignore[no-any-return]

    def notify(self, alias: str, queues: Iterable[str]) -> None:
        if not conf.get("LISTEN"):
            return
        with connections[alias].cursor() as cursor:
            for queue in sorted(set(queues)):
                cursor.execute(sql.NOTIFY, [conf.get("CHANNEL"), queue])

    def notify_freed(self, alias: str, keys: Iterable[str]) -> None:
        if not conf.get("LISTEN"):
            return
        pgrun.run(
            alias,
            sql.NOTIFY_EACH,
            [conf.get("CHANNEL"), [flow.FREED + key for key in sorted(set(keys))]],
        )

    # ---- enqueue ------------------------------------------------------------

    def insert_plain(self, jobs: JobQuerySet, job: NewJob) -> EnqueueResult:
        [(_notified, enqueued_at)] = pgrun.run(jobs.db, sql.INSERT, _insert_params(job))
        return EnqueueResult(job.id, False, job.name, job.queue, enqueued_at, jobs.db)

    def insert_keyed(self, jobs: JobQuerySet, job: NewJob) -> Holder | None:
        alias = jobs.db
        rows = pgrun.run(alias, sql.INSERT_KEYED, _insert_params(job))
        if not rows:
            return None
        kind, job_id, fingerprint, _notified, enqueued_at, recheck = rows[0]
        if recheck and (marker := pgrun.run(alias, sql.MARKER_OF_KEY, [job.key])):
            jobs.filter(id=job_id).delete()  # in the caller's transaction
            [(done_id, done_fingerprint)] = marker
            return Holder("completed", done_id, done_fingerprint, None)
        return Holder(kind, job_id, fingerprint, enqueued_at)

    def insert_many(self, jobs: JobQuerySet, plain: list[NewJob], every: list[NewJob]) -> datetime:
        alias = jobs.db
        now = self.now(alias)
        if plain:
            with connections[alias].cursor() as cursor, cursor.cursor.copy(sql.COPY_JOBS) as copy:
                copy.write(_copy_rows(plain, now))
        return now

    def insert_replays(self, jobs: JobQuerySet, new: Sequence[NewJob]) -> None:
        alias = jobs.db
        rows = pgrun.run(alias, sql.INSERT_REPLAYS, _replay_params(new))
        if len(rows) < len(new):
            raise KeyRaced
        key_of = {job.id: job.key for job in new}
        recheck = [key_of[job_id] for job_id, _queue, again in rows if again]
        if recheck and CompletionMarker.objects.using(alias).filter(key__in=recheck).exists():
            raise KeyRaced
        self.notify(alias, {queue for _id, queue, _again in rows if queue is not None})

    def write_workflow(self, jobs: JobQuerySet, steps: WorkflowRows) -> None:
        # COPY: its text rows built here beat adapting 10,000s of model instances.
        now = steps.now
        with connections[jobs.db].cursor() as cursor:
            raw = cursor.cursor
            if steps.plain:
                with raw.copy(sql.COPY_STEPS) as copy:
                    copy.write(_copy_rows(steps.plain, now, counts=True))
            if steps.edges:
                with raw.copy(sql.COPY_EDGES) as copy:
                    copy.write(_copy_edges(steps.edges, now))
            if steps.written:
                with raw.copy(sql.COPY_WORKFLOW_STEPS) as copy:
                    copy.write(_copy_workflow_steps(steps.workflow, steps.written, now))

    # ---- claim --------------------------------------------------------------

    def claim(self, jobs: JobQuerySet, request: ClaimRequest) -> list[ClaimedJob]:
        if conf.get("CLAIM") == "orm":
            return super().claim(jobs, request)
        params = sql.claim_params(
            request.queues,
            request.limit,
            request.token,
            request.lease,
            request.exclude_names,
            request.beat,
            request.names,
        )
        seconds = aging.step()
        if seconds is not None:
            params["aging"] = seconds
            return _claimed(pgrun.run(jobs.db, sql.CLAIM_AGED, params), request.token)
        return _claimed(pgrun.run(jobs.db, sql.CLAIM, params), request.token)

    def claim_flow(
        self, jobs: JobQuerySet, request: ClaimRequest, finished: Sequence[Finished] = ()
    ) -> tuple[Settled, list[ClaimedJob]]:
        """Claim the limited groups' jobs within their limits, then the others.

        The limited half is one transaction: the settle of `finished` (see
        claim.complete_and_claim), the groups' advisory locks, then one
        CLAIM_LIMITED per group, each counting after the locks are granted. The
        other half is the usual claim, without the limited names and queues.
        Returns the positions in `finished` settled, and the jobs claimed.
        """
        alias = jobs.db
        limited_names = [g.value for g in request.flow_limits if g.kind == "name"]
        limited_queues = {g.value for g in request.flow_limits if g.kind == "queue"}
        batch = _id_order(finished)
        settled, claimed = _claim_groups(alias, request, limited_names, batch)
        if batch:  # what the fence left, settled on its own
            settled = _settle_fenced(alias, batch, settled)
        done_at = settled or Settled()
        rest = max(request.limit - len(claimed), 0) if request.others else 0
        if not rest and request.beat is None:
            return done_at, claimed
        unlimited = [q for q in request.queues if q not in limited_queues]
        if conf.get("CLAIM") == "orm":
            if request.beat is not None:
                write_beat(alias, request.beat)
            if rest and unlimited:
                with transaction.atomic(using=alias):
                    claimed += self.claim_rows(
                        jobs.select_for_update(skip_locked=True),
                        request._replace(queues=unlimited, limit=rest),
                        limited_names,
                    )
            return done_at, claimed
        params = {
            **sql.claim_params(
                unlimited,
                rest,
                request.token,
                request.lease,
                request.exclude_names,
                request.beat,
                request.names,
            ),
            "limited": limited_names,
        }
        statement = sql.CLAIM_UNLIMITED
        if (seconds := aging.step()) is not None:
            params["aging"], statement = seconds, sql.CLAIM_UNLIMITED_AGED
        return done_at, claimed + _claimed(pgrun.run(alias, statement, params), request.token)

    # ---- settle -------------------------------------------------------------

    def complete(self, jobs: JobQuerySet, finished: Sequence[Finished]) -> Settled:
        return _settle_fenced(jobs.db, _id_order(finished), None)

    def complete_atomically(self, jobs: JobQuerySet, job: ClaimedJob, result: str | None) -> bool:
        statement = sql.COMPLETE_ATOMIC_LOCKING if job.dependents else sql.COMPLETE_ATOMIC
        [(deleted, marked, dependents)] = pgrun.run(
            jobs.db, statement, {"id": job.id, "token": job.token, "result": result}
        )
        if not deleted:
            raise LeaseLost(f"job {job.id} was taken over by another worker")
        job.dependents = int(dependents)
        if marked and dependents:
            self.release_dependents(jobs, [job.idempotency_key])
        return bool(marked)

    def release_dependents(self, jobs: JobQuerySet, keys: Sequence[str]) -> int:
        [(made_due, _)] = pgrun.run(jobs.db, sql.RELEASE, {"keys": list(keys), **_notify_params()})
        return int(made_due)

    def extend(
        self, jobs: JobQuerySet, ids: list[uuid.UUID], tokens: list[str], seconds: float
    ) -> dict[uuid.UUID, bool]:
        return dict(pgrun.run(jobs.db, sql.EXTEND_LEASES, [float(seconds), ids, tokens]))

    # ---- replay -------------------------------------------------------------

    def mark_replayed(self, alias: str, jobs: dict[uuid.UUID, NewJob], by: str) -> None:
        letters, new = list(jobs), [job.id for job in jobs.values()]
        pgrun.run(alias, sql.MARK_REPLAYED, {"by": by, "letters": letters, "jobs": new})
        keys = [job.key for job in jobs.values()]
        pgrun.run(alias, sql.MOVE_REPLAYED_STEPS, {"letters": letters, "jobs": new, "keys": keys})


def _id_order(
    finished: Sequence[Finished],
) -> Batch:
    """A settle batch with its positions, in id order: its DELETE then locks rows in the
    order an enqueue locks its parents (find_parents), so the two cannot deadlock."""
    return sorted(enumerate(finished), key=lambda item: item[1].id)


def _settle_fenced(
    alias: str,
    batch: Batch,
    settled: Settled | None,
) -> Settled:
    """Return what sql.COMPLETE settled of batch (None: run it now), fenced rows included."""
    if settled is None:
        settled = _complete(alias, batch)
    if len(settled) < len(batch):
        # Fenced (a dependent registered since the claim) or lost: lock and look.
        again = _complete_locked(alias, [item for item in batch if item[0] not in settled])
        settled |= again
        settled.woke = settled.woke or again.woke
    return settled


def _complete_locked(alias: str, batch: Batch) -> Settled:
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
            for job_id, locked_by, dependents in pgrun.run(
                alias, sql.LOCK_SETTLING, {"ids": ids, "tokens": tokens}
            )
        }
        held = [
            (index, Finished(job_id, token, result, now[job_id][1]))
            for index, (job_id, token, result, _) in batch
            if now.get(job_id, (None,))[0] == token
        ]
        return _complete(alias, held) if held else Settled()


def _complete(alias: str, batch: Sequence[tuple[int, Finished]]) -> Settled:
    """Run sql.COMPLETE on (position, (id, token, result, dependents)); return positions settled."""
    return _settled_of(pgrun.run(alias, *_complete_statement(batch)))


def _complete_statement(
    batch: Sequence[tuple[int, Finished]],
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


def _notify_params() -> dict[str, Any]:
    return {"channel": conf.get("CHANNEL"), "notify": bool(conf.get("LISTEN"))}


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
        "tags": json_text(job.tags),
        "meta": json_text(job.meta),
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
        "tags": [json_text(job.tags) for job in jobs],
        "meta": [json_text(job.meta) for job in jobs],
    }


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
        )
        for row in rows
    ]


# COPY's text format: backslash, tab, newline and carriage return are escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_NULL = "\\N"


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
        trace = _copy_text(job.trace_context)
        tags = _copy_text(json_text(job.tags))
        meta = _copy_text(json_text(job.meta))
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


def _copy_text(value: str | None) -> str:
    return _COPY_NULL if value is None else value.translate(_COPY_ESCAPES)


def _copy_edges(edges: list[tuple[uuid.UUID, Found, str]], now: datetime) -> str:
    """Return a workflow's edges as COPY text rows (sql.COPY_EDGES)."""
    stamp = now.isoformat()
    return "".join(
        f"{job_id}\t{_copy_text(f.key)}\t{f.id}\t{mode}\t{stamp}\t"
        f"{stamp if f.state == DONE else _COPY_NULL}\n"
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


def _groups(request: ClaimRequest) -> list[flow.Limit]:
    """The limited groups whose jobs this claim takes now (flow_claim), of its queues and names."""
    names, excluded = request.names, request.exclude_names
    return [
        g
        for g in request.flow_limits
        if (request.flow_claim is None or g.key in request.flow_claim)
        and (
            (g.kind == "queue" and g.value in request.queues)
            or (
                g.kind == "name" and (names is None or g.value in names) and g.value not in excluded
            )
        )
    ]


def _claim_groups(
    alias: str, request: ClaimRequest, limited_names: list[str], batch: Batch
) -> tuple[Settled | None, list[ClaimedJob]]:
    """The limited half of claim_flow: settle batch, lock the groups, claim each one's jobs.

    Returns what the settle settled (None: not run here) and the jobs claimed.
    """
    groups = _groups(request)
    limit, token = request.limit, request.token
    claimed: list[ClaimedJob] = []

    def group_params(group: flow.Limit) -> dict[str, Any]:
        claim = sql.claim_params(
            request.queues,
            limit - len(claimed),
            token,
            request.lease,
            request.exclude_names,
            None,
            request.names,
        )
        return sql.claim_limited_params(group, claim, limited_names)

    settled: Settled | None = None
    if len(groups) == 1 and limit > 0 and connections[alias].get_autocommit():
        # One group (a worker whose slot freed): settle, lock and claim in one round trip.
        [group] = groups
        done, rows = pgrun.run_locked(
            alias,
            group.key,
            sliding.claim_statement(group),
            group_params(group),
            before=_complete_statement(batch) if batch else None,
        )
        settled = _settled_of(done) if batch else None
        claimed += _claimed(rows, token)
    elif groups and limit > 0:
        with transaction.atomic(using=alias):
            if batch:
                settled = _complete(alias, batch)
            pgrun.run(alias, pgrun.FLOW_LOCK, [sorted(g.key for g in groups)])
            for group in groups:
                if len(claimed) >= limit:
                    break
                rows = pgrun.run(alias, sliding.claim_statement(group), group_params(group))
                claimed += _claimed(rows, token)
    return settled, claimed
