"""Admin pages for operations: schedules, queues (pause/resume), workers, running jobs (cancel).

Read-only pages with explicit actions, like the rest of the jobs admin. Registered
on ``admin.site`` from ``DjangoJobsConfig.ready()`` (so they sit beside whatever
``admin.py`` registers), each only if its model is not registered yet.
``cancel_jobs`` is a plain admin action that any Job admin can list too.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs import conf, control, schedules
from django_jobs.admin import (
    GuardedAdmin,
    NameQueueColumns,
    cell,
    list_when,
    pretty_json,
    pretty_payload,
    when,
)
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Job,
    QueueState,
    RunningJob,
    Schedule,
    WorkerBeat,
)


class _ReadOnly(GuardedAdmin):
    """No adding, no deleting, no editing: the actions are the only writes."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Actions need the change permission on the list; detail pages stay read-only.
        return obj is None and super().has_change_permission(request, obj)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Only the listed fields: the model's own JSON fields would bypass the bounded displays.
        return list(self.get_readonly_fields(request, obj))


# ---- schedules ------------------------------------------------------------------------


class ScheduleAdmin(_ReadOnly):
    # Fits 1280 px with the sidebar open: the job under the schedule's name, one state column.
    list_display = ["name_cell", "when", "state", "next_run", "last_run"]
    list_filter = ["enabled", "declared"]
    search_fields = ["name", "job_name"]
    actions = ["enable_schedules", "disable_schedules"]
    readonly_fields = [
        "name", "cron", "every", "timezone", "job_name", "payload_json", "queue", "priority",
        "enabled", "declared", "created_at", "updated_at", "last_tick_at", "last_enqueued_at",
        "last_job_id",
    ]  # fmt: skip

    @admin.display(description=_("payload"))
    def payload_json(self, obj: Schedule) -> SafeString:
        return pretty_payload(obj.payload)

    @admin.display(description=_("when"))
    def when(self, obj: Schedule) -> str:
        return f"every {obj.every}s" if obj.every else f"{obj.cron} ({obj.timezone})"

    @admin.display(description=_("name / job"), ordering="name")
    def name_cell(self, obj: Schedule) -> SafeString:
        return format_html(
            '{}<br><span class="django-jobs-quiet">{}</span>',
            cell(obj.name, 48, name=True), cell(obj.job_name, 64, name=True),
        )  # fmt: skip

    @admin.display(description=_("state"), ordering="enabled")
    def state(self, obj: Schedule) -> SafeString | str:
        if not obj.declared:
            return format_html(
                '<span title="{}">{}</span>', _("No worker's code declares it: it does not tick."),
                _("not declared"),
            )  # fmt: skip
        if not obj.enabled:
            return format_html('<strong class="django-jobs-paused">{}</strong>', _("disabled"))
        return _("enabled")

    @admin.display(description=_("next run"))
    def next_run(self, obj: Schedule) -> Any:
        spec = schedules.declared().get(obj.name)
        if spec is None or not obj.enabled or not obj.declared:
            return "-"
        return list_when(spec.next_tick(timezone.now()))

    @admin.display(description=_("last tick / job"), ordering="last_tick_at")
    def last_run(self, obj: Schedule) -> SafeString | str:
        if obj.last_tick_at is None:
            return "-"
        return format_html("{}<br>{}", list_when(obj.last_tick_at), self.last_job(obj))

    @admin.display(description=_("last job"))
    def last_job(self, obj: Schedule) -> str:
        if obj.last_job_id is None:
            return "-"
        if Job.objects.filter(id=obj.last_job_id).exists():
            state = _("live")
        elif CompletionMarker.objects.filter(job_id=obj.last_job_id).exists():
            state = _("done")
        elif DeadLetter.objects.filter(id=obj.last_job_id).exists():
            state = _("dead")
        else:
            state = _("pruned")
        return format_html('<span title="{}">{}</span>', obj.last_job_id, state)

    @admin.action(
        description=_("Enable selected schedules (missed ticks are not run)"),
        permissions=["change"],
    )
    def enable_schedules(self, request: HttpRequest, queryset: Any) -> None:
        count = queryset.enable()
        self.message_user(request, f"Enabled {count} schedule(s).", messages.SUCCESS)

    @admin.action(description=_("Disable selected schedules"), permissions=["change"])
    def disable_schedules(self, request: HttpRequest, queryset: Any) -> None:
        count = queryset.disable()
        self.message_user(request, f"Disabled {count} schedule(s).", messages.SUCCESS)


# ---- queues ---------------------------------------------------------------------------


def _count(**filters: Any) -> Coalesce:
    rows = Job.objects.filter(queue=OuterRef("name"), **filters).order_by().values("queue")
    return Coalesce(
        Subquery(rows.annotate(n=Count("id")).values("n")[:1], output_field=IntegerField()), 0
    )


class QueueStateAdmin(_ReadOnly):
    list_display = ["name_cell", "paused_mark", "waiting", "scheduled", "running", "oldest_wait"]
    list_filter = ["paused"]
    actions = ["pause_queues", "resume_queues"]
    readonly_fields = ["name", "paused", "paused_at", "paused_by", "reason"]

    def get_queryset(self, request: HttpRequest) -> Any:
        due = Q(locked_by__isnull=True, run_at__lte=Now())
        oldest = (
            Job.objects.filter(due, queue=OuterRef("name"))
            .order_by()
            .values("queue")
            .annotate(m=Min("run_at"))
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_waiting=_count(locked_by__isnull=True, run_at__lte=Now()),
                n_scheduled=_count(locked_by__isnull=True, run_at__gt=Now()),
                n_running=_count(locked_by__isnull=False),
                oldest_run_at=Subquery(oldest.values("m")[:1]),
            )
        )

    @admin.display(description=_("name"), ordering="name")
    def name_cell(self, obj: QueueState) -> SafeString | str:
        return cell(obj.name, 48, name=True)

    @admin.display(description=_("paused"), ordering="paused")
    def paused_mark(self, obj: QueueState) -> SafeString | str:
        """Neutral when running (the normal case); when paused, by whom, since when and why."""
        if not obj.paused:
            return format_html('<span class="django-jobs-quiet" title="{}">–</span>', _("no"))
        who = obj.paused_by or "—"
        since = list_when(obj.paused_at) if obj.paused_at else "—"
        return format_html(
            '<strong class="django-jobs-paused">{}</strong> {} {}, {}<br>{}',
            _("paused"), _("by"), cell(who, 40), since, cell(obj.reason, 80),
        )  # fmt: skip

    @admin.display(description=_("waiting"), ordering="n_waiting")
    def waiting(self, obj: Any) -> int:
        return obj.n_waiting

    @admin.display(description=_("scheduled"), ordering="n_scheduled")
    def scheduled(self, obj: Any) -> int:
        return obj.n_scheduled

    @admin.display(description=_("running"), ordering="n_running")
    def running(self, obj: Any) -> int:
        return obj.n_running

    @admin.display(description=_("oldest wait"))
    def oldest_wait(self, obj: Any) -> str:
        if obj.oldest_run_at is None:
            return "-"
        return f"{max(0.0, (timezone.now() - obj.oldest_run_at).total_seconds()):.0f}s"

    @admin.action(
        description=_("Pause selected queues (running jobs finish)"), permissions=["change"]
    )
    def pause_queues(self, request: HttpRequest, queryset: Any) -> None:
        count = control.pause(
            queryset.values_list("name", flat=True), by=request.user.get_username()
        )
        self.message_user(
            request,
            f"Paused {count} queue(s): workers stop claiming them within one poll.",
            messages.SUCCESS,
        )

    @admin.action(description=_("Resume selected queues"), permissions=["change"])
    def resume_queues(self, request: HttpRequest, queryset: Any) -> None:
        count = control.resume(queryset.values_list("name", flat=True))
        self.message_user(request, f"Resumed {count} queue(s).", messages.SUCCESS)


# ---- workers ------------------------------------------------------------------------


class WorkerBeatAdmin(_ReadOnly):
    list_display = ["host_cell", "pid", "queues_cell", "busy", "started", "last_seen", "live"]
    readonly_fields = [
        "id",
        "host",
        "pid",
        "queues_cell",
        "concurrency",
        "running",
        "started_at",
        "last_seen_at",
        "stats_json",
    ]

    @admin.display(description=_("host"), ordering="host")
    def host_cell(self, obj: WorkerBeat) -> SafeString | str:
        return cell(obj.host, 48, name=True)

    @admin.display(description=_("running / concurrency"))
    def busy(self, obj: WorkerBeat) -> str:
        return f"{obj.running} / {obj.concurrency}"

    @admin.display(description=_("started at"), ordering="started_at")
    def started(self, obj: WorkerBeat) -> SafeString | str:
        return list_when(obj.started_at)

    @admin.display(description=_("last seen"), ordering="last_seen_at")
    def last_seen(self, obj: WorkerBeat) -> SafeString | str:
        return list_when(obj.last_seen_at)

    @admin.display(description=_("queues"))
    def queues_cell(self, obj: WorkerBeat) -> SafeString | str:
        queues = obj.queues
        text = ", ".join(map(str, queues)) if isinstance(queues, list) else str(queues)
        return cell(text)

    @admin.display(description=_("stats"))
    def stats_json(self, obj: WorkerBeat) -> SafeString | str:
        return pretty_json(obj.stats)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("live"), boolean=True)
    def live(self, obj: WorkerBeat) -> bool:
        return (timezone.now() - obj.last_seen_at).total_seconds() < float(
            conf.get("WORKER_EXPIRY")
        )


# ---- running jobs ---------------------------------------------------------------------


@admin.action(description=_("Cancel selected jobs"), permissions=["cancel"])
def cancel_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: Any) -> None:
    """Cancel: waiting jobs go to the dead letters now, running ones stop at the next heartbeat."""
    result = control.cancel(
        list(queryset.values_list("id", flat=True)), by=request.user.get_username()
    )
    modeladmin.message_user(
        request,
        f"Cancelled {result.cancelled} waiting job(s); asked the workers of "
        f"{result.requested} running job(s) to stop them (they end in the dead letters as "
        "'cancelled' if their handler stops).",
        messages.SUCCESS,
    )


class RunningJobAdmin(NameQueueColumns, _ReadOnly):
    # Fits 1280 px with the sidebar open: the attempt, its start and its lease in one column.
    list_display = ["name_cell", "queue_cell", "worker", "attempt"]
    list_filter = ["queue", "name"]
    search_fields = ["id", "name", "key"]
    actions = [cancel_jobs]
    readonly_fields = [
        "id", "name", "queue", "priority", "attempts", "max_attempts", "key", "locked_by",
        "started_at", "attempted_at", "lease_expires_at", "cancel_requested_at",
    ]  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(locked_by__isnull=False)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.cancel_job")

    @admin.display(description=_("worker"))
    def worker(self, obj: Job) -> SafeString | str:
        return cell((obj.locked_by or "").rpartition("#")[0], 48, name=True)

    @admin.display(description=_("attempt / lease"), ordering="attempted_at")
    def attempt(self, obj: Job) -> SafeString:
        cancel = (
            format_html(
                '<br><strong class="django-jobs-paused" title="{}">{}</strong>',
                when(obj.cancel_requested_at),
                _("cancel asked"),
            )  # fmt: skip
            if obj.cancel_requested_at
            else ""
        )
        return format_html(
            '{}<br><span class="django-jobs-quiet">{} {}<br>{} {}</span>{}',
            _("attempt %(n)s of %(of)s") % {"n": obj.attempts, "of": obj.max_attempts},
            _("since"), list_when(obj.attempted_at),
            _("lease until"), list_when(obj.lease_expires_at), cancel,
        )  # fmt: skip


for _model, _admin in (
    (Schedule, ScheduleAdmin),
    (QueueState, QueueStateAdmin),
    (WorkerBeat, WorkerBeatAdmin),
    (RunningJob, RunningJobAdmin),
):
    if not admin.site.is_registered(_model):
        admin.site.register(_model, _admin)

# The site's index links the jobs dashboard (unless the project has an index template of its own).
if admin.site.index_template is None:
    admin.site.index_template = "admin/django_jobs/index.html"
