"""The tables: live jobs, completion markers, dead letters, workflows' edges and steps.

Each table has one job: ``Job`` holds live work only (waiting, scheduled or
leased), ``CompletionMarker`` one row per finished unit of work (keyed by its
idempotency key), ``DeadLetter`` the jobs that will not run again unless
replayed. Finishing or dead-lettering a job deletes its row in the same
transaction that writes the marker or the letter, so the hot table stays small.

Here: the tables, their choices, the ``JobState`` conditions and the querysets'
reads. Every state change (insert, claim, settle, cancel, replay...) is the
store's: ``django_jobs.store.JobStore``. The fleet's tables (queues, workers,
schedules) live in ``fleet.py``, which imports nothing of these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage
from django.db import connections, models
from django.db.models import Case, Exists, ExpressionWrapper, F, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce, Greatest, Now
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_jobs import flow
from django_jobs.attempts import MAX_LABEL, MAX_MESSAGE, error_summary, usable_errors

# Public here (django_jobs.models.DeadReason), and migration 0001 names models.uuid7.
from django_jobs.attempts import DeadReason as DeadReason

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
from django_jobs.payloads import storable_text
from django_jobs.rows import (
    ClaimedJob,
    definition,
)
from django_jobs.rows import uuid7 as uuid7

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


def released_run_at() -> Greatest:
    """The run_at of a blocked job its last parent releases, on the database clock: its
    release_delay from now, and not before its not_before (as sql._release sets it)."""
    # Coalesce: MySQL's GREATEST and SQLite's MAX are NULL when an argument is. Without a
    # delay, Now() itself: SQLite's text of now() + 0 has six decimals where its now() has
    # three, and text compares as text, so the job would read as scheduled (not claimable)
    # for the rest of that millisecond.
    return Greatest(
        Coalesce(Now() + F("release_delay"), Now()),
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


class JobQuerySet(models.QuerySet["Job"]):
    """Named state changes of live jobs: every insert, settle and notify of a job row."""

    # ---- enqueue ----------------------------------------------------------

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


def blocked_until() -> datetime:
    """BLOCKED_UNTIL as this project stores datetimes (naive when USE_TZ is off)."""
    return BLOCKED_UNTIL if settings.USE_TZ else BLOCKED_UNTIL.replace(tzinfo=None)


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
    # (sql._release, JobStore.release_dependents). NULL, as in rows written by
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


class FlowStart(models.Model):
    """The starts of one claim of a group (and partition) with a sliding rate window.

    Append-only, one row per claim that started jobs: the claim counts those of the
    last window (the (key, started_at) index) and deletes those older than
    flow.KEEP_STARTS seconds.
    """

    key = models.CharField(max_length=MAX_NAME_LENGTH + 10, help_text=_("The limited group."))
    partition = models.CharField(max_length=flow.MAX_PARTITION_LENGTH, default="", blank=True)
    started_at = models.DateTimeField()
    starts = models.IntegerField()

    objects = JobsDatabaseManager()

    class Meta:
        db_table = "django_jobs_flow_start"
        indexes = [models.Index(fields=["key", "started_at"], name="django_jobs_flow_start_at")]

    def __str__(self) -> str:
        return f"{self.key} {self.partition} {self.started_at}"


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
