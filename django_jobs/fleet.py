"""The fleet's tables: schedules, queue states (paused or not), worker heartbeats, unknown names.

They are small (one row per schedule, queue and live worker) and never on the
claim path: workers read them in their maintenance step, at most once per poll
interval, so that pausing a queue or disabling a schedule needs no deploy.
``models.py`` imports (and re-exports) them so that Django and migrations see
them; they import nothing of the job tables. (Formerly ``ops_models``.)
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connections, models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_jobs import conf, limits
from django_jobs.limits import (
    MAX_BY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_QUEUE_LENGTH,
    MAX_REASON_LENGTH,
    MAX_SCHEDULE_LENGTH,
    MAX_TOKEN_LENGTH,
)
from django_jobs.managers import JobsDatabaseManager


def _expiry() -> timedelta:
    return timedelta(seconds=float(conf.get("WORKER_EXPIRY")))


def unknown_name_grace() -> timedelta | None:
    """Return UNKNOWN_NAME_GRACE, up to ten years (None: never); raise ValueError if invalid."""
    return limits.duration(conf.get("UNKNOWN_NAME_GRACE"), what="UNKNOWN_NAME_GRACE")


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    """Named state changes of schedules."""

    def enable(self) -> int:
        """Enable schedules; ticks missed while disabled are not run.

        The tick state moves to now.
        """
        return self.filter(enabled=False).update(enabled=True, updated_at=Now(), last_tick_at=Now())

    def disable(self) -> int:
        return self.filter(enabled=True).update(enabled=False, updated_at=Now())

    def take_tick(self, name: str, tick: datetime) -> bool:
        """Record `tick` as handled if no worker has handled it (or a later one) yet.

        A compare-and-set on the row: of all the workers that try one tick, the
        first to commit wins and the others update nothing (PostgreSQL re-checks
        the condition after waiting for the winner's row lock). No leader needed.
        """
        return bool(
            self.filter(name=name, enabled=True, declared=True)
            .filter(Q(last_tick_at__isnull=True) | Q(last_tick_at__lt=tick))
            .update(last_tick_at=tick)
        )

    def note_job(self, name: str, job_id: UUID) -> int:
        return self.filter(name=name).update(last_job_id=job_id, last_enqueued_at=Now())


class Schedule(models.Model):
    """A periodic job: its definition (from settings or @periodic) and its tick state.

    Definitions are written by workers from the code they run; ``enabled`` and the
    tick state belong to the database, so a schedule can be switched off without a
    deploy and no tick runs twice.
    """

    name = models.CharField(max_length=MAX_SCHEDULE_LENGTH, primary_key=True)
    cron = models.CharField(max_length=200, blank=True, help_text=_("Five-field cron expression."))
    every = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Or: seconds between ticks (aligned on the epoch).")
    )
    timezone = models.CharField(max_length=64, default="UTC")
    job_name = models.CharField(max_length=MAX_NAME_LENGTH)
    payload = models.TextField(default="null", help_text=_("JSON text."))
    queue = models.CharField(max_length=MAX_QUEUE_LENGTH, null=True, blank=True)  # noqa: DJ001 - None: the job's own queue
    priority = models.SmallIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    declared = models.BooleanField(
        default=True, help_text=_("False once no worker's code declares it: it no longer ticks.")
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    last_tick_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_("Latest tick handled (or when re-enabled): ticks up to it never run again."),
    )
    last_enqueued_at = models.DateTimeField(null=True, blank=True)
    last_job_id = models.UUIDField(null=True, blank=True)

    objects = JobsDatabaseManager.from_queryset(ScheduleQuerySet)()

    class Meta:
        db_table = "django_jobs_schedule"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(cron="") | Q(every__isnull=False), name="django_jobs_schedule_trigger"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class QueueStateQuerySet(models.QuerySet["QueueState"]):
    """Named state changes of queues."""

    def pause(self, *, by: str = "", reason: str = "") -> int:
        return self.filter(paused=False).update(
            paused=True, paused_at=Now(), paused_by=by, reason=reason
        )

    def resume(self) -> int:
        return self.filter(paused=True).update(
            paused=False, paused_at=None, paused_by="", reason=""
        )

    def ensure(self, names: Any) -> None:
        """Create rows for queues not seen before (so that the admin lists them)."""
        self.bulk_create([QueueState(name=name) for name in names], ignore_conflicts=True)


class QueueState(models.Model):
    """A queue, and whether workers may claim its jobs. Running jobs always finish."""

    name = models.CharField(max_length=MAX_QUEUE_LENGTH, primary_key=True)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=MAX_BY_LENGTH, blank=True, default="")
    reason = models.CharField(max_length=MAX_REASON_LENGTH, blank=True, default="")

    objects = JobsDatabaseManager.from_queryset(QueueStateQuerySet)()

    class Meta:
        db_table = "django_jobs_queue"
        ordering = ["name"]
        verbose_name = _("queue")

    def __str__(self) -> str:
        return self.name


class WorkerBeatQuerySet(models.QuerySet["WorkerBeat"]):
    def live(self) -> WorkerBeatQuerySet:
        """Workers whose heartbeat row is younger than WORKER_EXPIRY (database clock)."""
        return self.filter(last_seen_at__gte=Now() - _expiry())


# Upper bounds (seconds) of the job duration histogram in WorkerBeat.stats["duration_buckets"]
# (a count per bound, then +Inf): the worker's upkeep fills it, the metrics view reads it.
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class WorkerBeat(models.Model):
    """A worker process, as its last heartbeat described it."""

    id = models.CharField(
        max_length=MAX_TOKEN_LENGTH, primary_key=True, help_text=_("host:pid:random")
    )
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.IntegerField()
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    running = models.IntegerField(default=0, help_text=_("Jobs running at the last heartbeat."))
    stats = models.JSONField(default=dict, help_text=_("Counters since the worker started."))
    handlers = models.JSONField(
        null=True,
        blank=True,
        help_text=_("Job names it claims; null: not published (an earlier release)."),
    )

    objects = JobsDatabaseManager.from_queryset(WorkerBeatQuerySet)()

    class Meta:
        db_table = "django_jobs_worker"
        ordering = ["host", "pid"]
        verbose_name = _("worker")

    def __str__(self) -> str:
        return self.id


class UnknownNameQuerySet(models.QuerySet["UnknownName"]):
    def current(self, now: Any = None) -> UnknownNameQuerySet:
        """Names a live worker's upkeep has confirmed within WORKER_EXPIRY."""
        return self.filter(seen_at__gte=(Now() if now is None else now) - _expiry())

    def observe(self, found: dict[str, int], now: datetime) -> None:
        """Record the names found unknown at `now` (name: claimable jobs); forget the others."""
        self.exclude(name__in=list(found)).delete()
        if not found:
            return
        # A gap in the observations (no worker was live to look) restarts the
        # clock: an outage of the whole fleet is not an unknown name.
        self.filter(name__in=list(found), seen_at__lt=now - _expiry()).update(since=now)
        # MySQL and MariaDB upsert on any unique key (the name: the primary key) and
        # refuse to be told which.
        target = connections[self.db].features.supports_update_conflicts_with_target
        self.bulk_create(
            [UnknownName(name=n, jobs=jobs, since=now, seen_at=now) for n, jobs in found.items()],
            update_conflicts=True,
            unique_fields=["name"] if target else None,
            update_fields=["jobs", "seen_at"],
        )


class UnknownName(models.Model):
    """A job name with claimable jobs that no live worker knows, as the upkeep last saw it.

    Written by the workers' upkeep (worker/upkeep.py), read by `jobs status`, the
    dashboard and the jobs admin. Jobs of such a name wait; once the name has
    been unknown for UNKNOWN_NAME_GRACE they are dead-lettered as unknown_name.
    """

    name = models.CharField(max_length=MAX_NAME_LENGTH, primary_key=True)
    since = models.DateTimeField(help_text=_("Since when no live worker has known the name."))
    seen_at = models.DateTimeField(help_text=_("When a worker last found it so."))
    jobs = models.IntegerField(default=0, help_text=_("Claimable jobs of the name then."))

    objects = JobsDatabaseManager.from_queryset(UnknownNameQuerySet)()

    class Meta:
        db_table = "django_jobs_unknown_name"
        ordering = ["name"]
        verbose_name = _("unknown job name")

    def __str__(self) -> str:
        return self.name
