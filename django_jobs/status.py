"""What the queues hold now, and which workers are alive: for `jobs status`, the admin, metrics.

Every figure is read from the tables on the database clock, in five queries
(jobs by queue, markers and dead letters of the last hour by queue, workers,
the job names no live worker knows), one more when jobs are blocked (the
dead-lettered parents they wait for), and two per limited group of flow control.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import Count, Exists, OuterRef, QuerySet, Sum

from django_jobs import conf, flow, registry, tagging
from django_jobs.fleet import unknown_name_grace
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    FlowStart,
    FlowWindow,
    Job,
    JobState,
    QueueState,
    UnknownName,
    WorkerBeat,
)
from django_jobs.progress import read as read_progress
from django_jobs.store import JobStore
from django_jobs.worker.ticker import db_now

RECENT = timedelta(hours=1)


@dataclass
class QueueStatus:
    name: str
    paused: bool = False
    waiting: int = 0  # due now, not leased
    scheduled: int = 0  # due later
    running: int = 0  # leased to a worker
    blocked: int = 0  # workflow steps waiting for their parents to finish
    oldest_wait: float | None = None  # seconds the longest-waiting due job has waited
    done_last_hour: int = 0
    dead_last_hour: int = 0


@dataclass
class WorkerStatus:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    running: int
    started_at: datetime
    last_seen_at: datetime
    # A dict of counters as workers write it; anything at all in a hand-edited row.
    stats: Any = field(default_factory=dict)
    # Handlers running past their timeout, each holding a thread until it returns;
    # the worker exits (code 3) when they fill all `concurrency` threads.
    abandoned: int = 0


@dataclass
class UnknownNameStatus:
    """A job name with claimable jobs that no live worker knows: its jobs wait."""

    name: str
    jobs: int  # claimable jobs of the name, at the upkeep's last look
    since: datetime  # since when no live worker has known it
    dead_letter_at: datetime | None  # its jobs are dead-lettered from then on; None: never


@dataclass
class FlowStatus:
    """A limited group (docs/flow-control.md): its limits and their use now."""

    kind: str  # "name" (a handler) or "queue"
    value: str
    global_concurrency: int | None
    rate_limit: str | None  # "100/m"
    partitioned: bool
    running: int  # jobs under a live lease
    starts: int  # starts in the current rate window (0 without a rate limit)
    # The busiest partitions: (partition, running, starts), at most BUSIEST of them.
    partitions: list[tuple[str, int, int]] = field(default_factory=list)


BUSIEST = 5


@dataclass
class DeadParentsStatus:
    """Blocked jobs that wait for dead-lettered parents: only the parents' replay frees them."""

    jobs: int  # blocked jobs' unsatisfied edges to them (a job waiting for two counts twice)
    letters: int  # the pending dead letters waited for
    ids: list[str]  # at most DEAD_PARENT_IDS of them, the most waited-for first


DEAD_PARENT_IDS = 3


@dataclass
class CycleStatus:
    """Blocked jobs that wait for each other (written before enqueues refused it)."""

    job: str  # the job of a dead key enqueued again that closes it: cancel it
    keys: list[str]  # its key, then the keys it waits for round to it
    letters: list[str]  # the pending letters of its key: replay them once it is cancelled


# Running jobs `jobs status` shows with their progress: the latest attempts first.
PROGRESS_SHOWN = 20


@dataclass
class ProgressStatus:
    """A running job that reported progress (ctx.progress())."""

    id: str
    name: str
    queue: str
    done: float
    total: float | None
    note: str
    text: str  # "5/10 (50%) note"


@dataclass
class Status:
    now: datetime
    queues: list[QueueStatus]
    workers: list[WorkerStatus]
    unknown_names: list[UnknownNameStatus] = field(default_factory=list)
    flow: list[FlowStatus] = field(default_factory=list)
    dead_parents: DeadParentsStatus | None = None
    cycles: list[CycleStatus] = field(default_factory=list)
    progress: list[ProgressStatus] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "queues": [asdict(q) for q in self.queues],
            "flow": [asdict(f) for f in self.flow],
            "unknown_names": [
                {
                    **asdict(u),
                    "since": u.since.isoformat(),
                    "dead_letter_at": u.dead_letter_at and u.dead_letter_at.isoformat(),
                }
                for u in self.unknown_names
            ],
            "workers": [
                {
                    **asdict(w),
                    "started_at": w.started_at.isoformat(),
                    "last_seen_at": w.last_seen_at.isoformat(),
                }
                for w in self.workers
            ],
            "dead_parents": self.dead_parents and asdict(self.dead_parents),
            "cycles": [asdict(c) for c in self.cycles],
            "progress": [asdict(p) for p in self.progress],
        }


def count_by(queryset: QuerySet[Any], column: str) -> dict[Any, int]:
    """Count the rows of queryset per value of column, in one GROUP BY."""
    return dict(queryset.order_by().values_list(column).annotate(n=Count("pk")))


def queue_status(alias: str | None = None, now: datetime | None = None) -> list[QueueStatus]:
    """Return per-queue figures for each queue that has jobs, recent history, a row or a handler."""
    alias = alias or conf.database()
    now = now or db_now(alias)
    queues: dict[str, QueueStatus] = {}

    def get(name: str) -> QueueStatus:
        return queues.setdefault(name, QueueStatus(name))

    for name in {h.get_queue() for h in registry.all_handlers().values()} | {
        conf.get("DEFAULT_QUEUE")
    }:
        get(name)
    for name, paused in QueueState.objects.using(alias).values_list("name", "paused"):
        get(name).paused = paused
    for row in Job.objects.using(alias).counts_by_queue(now):
        q = get(row["queue"])
        q.waiting, q.scheduled, q.running = row["waiting"], row["scheduled"], row["running"]
        q.blocked = row["blocked"]
        if row["oldest"] is not None:
            q.oldest_wait = max(0.0, (now - row["oldest"]).total_seconds())
    since = now - RECENT
    markers = CompletionMarker.objects.using(alias).filter(completed_at__gte=since)
    for name, n in count_by(markers, "queue").items():
        get(name).done_last_hour = n
    letters = DeadLetter.objects.using(alias).filter(dead_at__gte=since)
    for name, n in count_by(letters, "queue").items():
        get(name).dead_last_hour = n
    return sorted(queues.values(), key=lambda q: q.name)


def unknown_names(alias: str | None = None, now: Any = None) -> list[UnknownNameStatus]:
    """Return the job names no live worker knows, as the workers' upkeep last found them."""
    alias = alias or conf.database()
    try:
        grace = unknown_name_grace()
    except ValueError:  # reported by the system checks
        grace = None
    return [
        UnknownNameStatus(
            row.name, row.jobs, row.since, None if grace is None else row.since + grace
        )
        for row in UnknownName.objects.using(alias).current(now)
    ]


def dead_parents(alias: str | None = None) -> DeadParentsStatus | None:
    """Return the dead-lettered parents live jobs wait for, or None when none does."""
    alias = alias or conf.database()
    # A letter whose key a live job holds (enqueued again) frees nothing if replayed:
    # its replay is refused, and its waiters wait for that job, its dependents now.
    held = Job.objects.using(alias).filter(key=OuterRef("key"))
    letters = DeadLetter.objects.using(alias).waited_for().exclude(Exists(held))
    # One query. The stubs know no annotation: [misc].
    waited = letters.filter(waiting__gt=0).order_by("-waiting", "dead_at", "id")  # type: ignore[misc]
    rows = list(waited.values_list("id", "waiting"))  # type: ignore[misc]
    if not rows:
        return None
    return DeadParentsStatus(
        jobs=sum(waiting for _, waiting in rows),
        letters=len(rows),
        ids=[str(letter_id) for letter_id, _ in rows[:DEAD_PARENT_IDS]],
    )


def flow_status(alias: str | None = None, now: datetime | None = None) -> list[FlowStatus]:
    """Return each limited group with its limits, running jobs and starts in the window."""
    alias = alias or conf.database()
    try:
        groups = flow.configured(registry.all_handlers().values(), conf.get("QUEUES"))
    except ValueError:  # reported by the system checks (E301)
        return []
    if not groups:
        return []
    now = now or db_now(alias)
    limited = [g.value for g in groups if g.kind == "name"]
    found = []
    for group in groups:
        jobs = Job.objects.using(alias).filter(**{group.kind: group.value})
        if group.kind == "queue":
            jobs = jobs.exclude(name__in=limited)
        running = count_by(jobs.running(), "partition")
        starts: dict[str, int] = {}
        if group.rate is not None:
            # As the claim counts them: the counter of its window, or the release before's.
            windows = FlowWindow.objects.using(alias).filter(
                key__in=group.counters_read(), window_start=flow.window_start(now, group.rate)
            )
            for partition, n in windows.values_list("partition", "starts"):
                starts[partition] = max(starts.get(partition, 0), n)
        if group.sliding:  # as its claim counts them (store/sliding.py), ends included
            assert group.rate is not None  # noqa: S101 - sliding implies a rate
            logged = FlowStart.objects.using(alias).filter(
                key=group.key, started_at__gte=now - timedelta(seconds=group.rate.seconds)
            )
            for partition, n in (
                logged.values("partition").annotate(n=Sum("starts")).values_list("partition", "n")
            ):
                starts[partition] = max(starts.get(partition, 0), n)
        by_partition: dict[str, list[int]] = {}
        for partition, n in running.items():
            by_partition.setdefault(partition or "", [0, 0])[0] += n
        for partition, n in starts.items():
            by_partition.setdefault(partition, [0, 0])[1] += n
        busiest = sorted(by_partition.items(), key=lambda item: (-sum(item[1]), item[0]))
        found.append(
            FlowStatus(
                kind=group.kind,
                value=group.value,
                global_concurrency=group.concurrency,
                rate_limit=None
                if group.rate is None
                else f"{group.rate} sliding"
                if group.sliding
                else str(group.rate),
                partitioned=group.partitioned,
                running=sum(running.values()),
                starts=sum(starts.values()),
                partitions=(
                    [(p, r, n) for p, (r, n) in busiest[:BUSIEST]] if group.partitioned else []
                ),
            )
        )
    return found


def live_workers(alias: str | None = None) -> list[WorkerStatus]:
    """Return the workers whose heartbeat row is younger than WORKER_EXPIRY."""
    alias = alias or conf.database()
    rows = WorkerBeat.objects.using(alias).live()
    return [
        WorkerStatus(
            id=w.id,
            host=w.host,
            pid=w.pid,
            # JSON columns: a hand-edited row must not break the status pages.
            queues=[str(q) for q in w.queues] if isinstance(w.queues, list) else [],
            concurrency=w.concurrency,
            running=w.running,
            started_at=w.started_at,
            last_seen_at=w.last_seen_at,
            stats=w.stats,
            abandoned=_count(w.stats, "abandoned"),
        )
        for w in rows
    ]


def _count(stats: Any, key: str) -> int:
    """Return stats[key] if the row holds a count there (a hand-edited row may not), else 0."""
    value = stats.get(key) if isinstance(stats, dict) else None
    return value if type(value) is int and value >= 0 else 0


def status(alias: str | None = None) -> Status:
    alias = alias or conf.database()
    now = db_now(alias)
    queues = queue_status(alias, now)
    return Status(
        now=now,
        queues=queues,
        workers=live_workers(alias),
        unknown_names=unknown_names(alias, now),
        flow=flow_status(alias, now),
        # Without a blocked job no parent is waited for: no query.
        dead_parents=dead_parents(alias) if any(q.blocked for q in queues) else None,
        cycles=blocked_cycles(alias) if any(q.blocked for q in queues) else [],
        # Without a running job none reports progress: no query.
        progress=running_progress(alias) if any(q.running for q in queues) else [],
    )


class TaggedCount(NamedTuple):
    """The jobs and pending dead letters of a queue that carry some tags (jobs status --tag)."""

    queue: str
    waiting: int
    scheduled: int
    running: int
    blocked: int
    dead: int


def tagged_counts(tags: list[str], alias: str | None = None) -> list[TaggedCount]:
    """Count, per queue and state, the jobs (and letters not replayed) with every tag of tags."""
    alias = alias or conf.database()
    jobs = tagging.tagged(Job.objects.using(alias).with_state(), tags)
    counts: dict[str, dict[str, int]] = {}
    # "state" is with_state()'s annotation, which the stubs cannot follow through tagged().
    for row in jobs.values("queue", "state").annotate(n=Count("id")).order_by():  # type: ignore[misc]
        counts.setdefault(row["queue"], {})[row["state"]] = row["n"]
    letters = tagging.tagged(DeadLetter.objects.using(alias).filter(replayed_at__isnull=True), tags)
    for row in letters.values("queue").annotate(n=Count("id")).order_by():
        counts.setdefault(row["queue"], {})["dead"] = row["n"]
    return [
        TaggedCount(
            queue,
            waiting=by.get(JobState.WAITING, 0),
            scheduled=by.get(JobState.SCHEDULED, 0),
            running=by.get(JobState.RUNNING, 0),
            blocked=by.get(JobState.BLOCKED, 0),
            dead=by.get("dead", 0),
        )
        for queue, by in sorted(counts.items())
    ]


def running_progress(alias: str | None = None) -> list[ProgressStatus]:
    """Return the running jobs that reported progress, latest attempt first (PROGRESS_SHOWN)."""
    alias = alias or conf.database()
    rows = (
        Job.objects.using(alias)
        .running()
        .filter(progress__isnull=False)
        .order_by("-attempted_at")
        .values_list("id", "name", "queue", "progress")[:PROGRESS_SHOWN]
    )
    shown = []
    for job_id, name, queue, value in rows:
        found = read_progress(value)
        if found is not None:
            shown.append(
                ProgressStatus(
                    str(job_id), name, queue, found.done, found.total, found.note, str(found)
                )
            )
    return shown


def blocked_cycles(alias: str | None = None) -> list[CycleStatus]:
    """Return the cycles of blocked jobs (JobStore.cycles), each with the job that closes it."""
    alias = alias or conf.database()
    return [
        CycleStatus(str(job_id), keys, [str(letter) for letter in letters])
        for job_id, keys, letters in JobStore(alias).cycles()
    ]
