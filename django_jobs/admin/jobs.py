"""The live-job admins: every job (run now, cancel, the dashboard) and the running ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs import limits, progress
from django_jobs.admin.base import (
    IdOrTermSearch,
    NameQueueColumns,
    OperationsAdmin,
    ReadOnlyAdmin,
    log_changes,
    parse_uuid,
)
from django_jobs.admin.dashboard import DashboardView
from django_jobs.admin.display import (
    EMPTY,
    attempt_history,
    cell,
    list_when,
    pretty_payload,
    showable,
    when,
    when_field,
)
from django_jobs.admin.tags import MetaFilter, TagFilter
from django_jobs.admin.workflows import WorkflowFields
from django_jobs.attempts import worker_of
from django_jobs.models import (
    DeadLetter,
    Job,
    JobQuerySet,
    JobState,
    RunningJob,
    UnknownName,
    blocked_until,
)
from django_jobs.store import JobStore

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

UNKNOWN_NAME = "unknown_name"


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, StrOrPromise]]:
        return [*JobState.choices, (UNKNOWN_NAME, _("waiting: no live worker knows its name"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        jobs = cast(JobQuerySet, queryset)  # the job admins' lists
        value = self.value()
        if value == UNKNOWN_NAME:
            return jobs.claimable().filter(unknown_since__isnull=False)  # type: ignore[misc]  # get_queryset's annotation
        if value == JobState.WAITING:
            return jobs.waiting()
        if value == JobState.SCHEDULED:
            return jobs.scheduled()
        if value == JobState.BLOCKED:
            return jobs.blocked()
        if value == JobState.RUNNING:
            return jobs.running()
        return queryset


@admin.action(
    permissions=["cancel"],
    # Short: the select is as wide as its longest label, and a long one pushed the Run
    # button onto a line of its own at 1280 px. The message after it says what happened.
    description=_("Cancel selected jobs (to the dead letters)"),
)
def cancel_jobs(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    """Dead-letter the selected waiting jobs now; ask the workers of running ones to stop them."""
    names = dict(queryset.values_list("id", "name"))
    store = JobStore(queryset.db)
    report = store.cancel(cast(JobQuerySet, queryset), by=request.user.get_username())
    # A running job's handler is stopped by its worker: flag it for the next heartbeat.
    store.request_cancel(Job.objects.filter(id__in=report.running))
    if request.POST.get("select_across") != "1":
        # Ticked on the page but finished before the click: no longer in the queryset.
        ticked = {parse_uuid(v) for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)}
        report.gone += sorted(pk for pk in ticked - set(names) if pk is not None)
    if report.cancelled:
        moved = "Cancelled: moved from the live jobs."
        entries = [(pk, f"{names[pk]} {pk} (cancelled)", moved) for pk in report.cancelled]
        log_changes(request, DeadLetter, entries, CHANGE)
    if report.running:
        asked = "Cancel requested: its worker stops it at its next heartbeat."
        entries = [(pk, f"{names[pk]} {pk}", asked) for pk in report.running]
        log_changes(request, Job, entries, CHANGE)
    message = (
        f"{len(report.cancelled)} cancelled (moved to the dead letters, where they can be replayed)"
    )
    if report.running:
        message += (
            f"; asked the workers of {len(report.running)} running job(s) to stop them (they end "
            "in the dead letters as 'cancelled' if their handler stops)"
        )
    level = messages.SUCCESS
    if report.gone:
        level = messages.WARNING
        message += f"; {len(report.gone)} no longer live (finished meanwhile)"
    modeladmin.message_user(request, f"{message}.", level)


class CancelPermission:
    """Who may run cancel_jobs: the one permission of both job lists."""

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.cancel_job")


def _released(obj: Job) -> str:
    """When a blocked job will be due: after its parents, and its own delay or run_at."""
    text = str(_("after its parents"))
    if obj.release_delay:
        delay = limits.format_duration(obj.release_delay)
        text = str(_("%(delay)s after its parents")) % {"delay": delay}
    if obj.not_before is not None:
        not_before = when(obj.not_before)
        text = str(_("%(text)s, not before %(when)s")) % {"text": text, "when": not_before}
    return text


@admin.register(Job)
class JobAdmin(
    DashboardView, IdOrTermSearch, CancelPermission, WorkflowFields, NameQueueColumns, ReadOnlyAdmin
):
    # Fits 1280 px with the sidebar open: the name links the job, the state says the attempt,
    # the lease (holder and time left) is one column.
    list_display = ["name_cell", "queue_cell", "state_label", "run_at_cell", "lease"]
    list_display_links = ["name_cell"]
    list_filter = [StateFilter, "queue", "name", TagFilter, MetaFilter]
    search_fields = ["id", "key", "name"]
    search_help_text = _("A job id or key (exact), or words of the name.")
    actions = ["run_now", "cancel"]
    list_deferred = ["payload", "errors"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("name", "queue"),
                    ("id", "key", "partition"),
                    ("state_label", "priority", "attempts_of"),
                    ("run_at_time", "enqueued_at_time"),
                    ("started_at_time", "attempted_at_time"),
                ]
            },
        ),
        (_("Lease"), {"fields": [("lease_holder", "locked_by", "lease_expires_at_time")]}),
        (_("Payload"), {"fields": ["payload_json"]}),
        (_("Earlier attempts"), {"fields": ["attempt_table"]}),
    ]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        # Right after the job's own facts: for a blocked job, what it waits for is the news.
        first, *rest = self.fieldsets
        if obj is not None and obj.run_at >= blocked_until():  # "after its parents", not 9000
            fields = [
                tuple("run_at_cell" if f == "run_at_time" else f for f in row)
                if isinstance(row, tuple)
                else row
                for row in first[1]["fields"]
            ]
            first = (first[0], {**first[1], "fields": fields})
        return [first, *self.workflow_fieldset(obj), *rest]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Since when no live worker knows the job's name (a subquery: no query per row).
        unknown = UnknownName.objects.current().filter(name=OuterRef("name")).values("since")
        jobs = cast(JobQuerySet, super().get_queryset(request)).with_state()
        annotated: QuerySet[Any] = jobs.annotate(unknown_since=Subquery(unknown[:1]))
        return annotated

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # cancel instead: the job stays inspectable and replayable

    # -- columns and fields

    @admin.display(description=_("state"), ordering="state")
    def state_label(self, obj: Job) -> SafeString | str:
        state = getattr(obj, "state", None)
        label = str(JobState(state).label) if state else EMPTY
        if state == JobState.BLOCKED:
            label = f"{label} ({_('waiting for %(n)s parent(s)') % {'n': obj.waiting_for}})"
        # Waiting, but still naming the worker whose lease ran out.
        expired = state == JobState.WAITING and obj.locked_by is not None
        since = getattr(obj, "unknown_since", None)
        if since is not None and state == JobState.WAITING:
            label = f"{label} ({_('no live worker knows this name since')} {when(since)[:16]})"
        elif expired:
            label = f"{label} ({_('lease expired: rescue is due')})"
        if not obj.attempts:
            return label
        counts = {"n": obj.attempts, "of": obj.max_attempts}
        # Waiting after a failure, "attempt 3 of 8" read as if the third were the next.
        if state == JobState.RUNNING:
            attempt = _("attempt %(n)s of %(of)s") % counts
        else:
            attempt = _("%(n)s of %(of)s attempts made") % counts
        return format_html('{}<br><span class="django-jobs-quiet">{}</span>', label, attempt)

    @admin.display(description=_("attempts"))
    def attempts_of(self, obj: Job) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    run_at_time = when_field(Job, "run_at")
    enqueued_at_time = when_field(Job, "enqueued_at")
    started_at_time = when_field(Job, "started_at")
    attempted_at_time = when_field(Job, "attempted_at")
    lease_expires_at_time = when_field(Job, "lease_expires_at")

    @admin.display(description=_("run at"), ordering="run_at")
    def run_at_cell(self, obj: Job) -> SafeString | str:
        if obj.run_at >= blocked_until():  # the sentinel of a blocked job, not a date to read
            return format_html('<span class="django-jobs-quiet">{}</span>', _released(obj))
        return list_when(obj.run_at)

    @admin.display(description=_("lease holder"))
    def lease_holder(self, obj: Job) -> str:
        return showable(worker_of(obj.locked_by)) if obj.locked_by else EMPTY

    @admin.display(description=_("lease"), ordering="lease_expires_at")
    def lease(self, obj: Job) -> SafeString | str:
        """The worker holding the job, and how long its lease has left (or since it expired)."""
        if not obj.locked_by or obj.lease_expires_at is None:
            return EMPTY
        left = (obj.lease_expires_at - timezone.now()).total_seconds()
        if left >= 0:
            until = _("%(left)s left") % {"left": limits.format_duration(left)}
        else:
            until = _("expired %(ago)s ago") % {"ago": limits.format_duration(left)}
        holder = worker_of(obj.locked_by)
        return format_html(
            '{}<br><span class="django-jobs-quiet" title="{}">{}</span>',
            cell(holder, 48, name=True),
            when(obj.lease_expires_at),
            until,
        )

    @admin.display(description=_("payload"))
    def payload_json(self, obj: Job) -> SafeString:
        return pretty_payload(obj.payload)

    @admin.display(description=_("errors"))
    def attempt_table(self, obj: Job) -> SafeString | str:
        return attempt_history(obj.errors)

    def search_term(self, term: str) -> Q:
        return Q(key=term) | Q(name__icontains=term)

    # -- actions

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.run_job_now")

    @admin.action(permissions=["run_now"], description=_("Run selected scheduled jobs now"))
    def run_now(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        scheduled = list(queryset.scheduled().values_list("id", "name"))
        moved = JobStore(queryset.db).run_now(queryset)
        if moved:
            entries = [(pk, f"{name} {pk}", "Made due now.") for pk, name in scheduled]
            log_changes(request, Job, entries, CHANGE)
        message = f"{moved} made due now"
        if selected > moved:
            message += f"; {selected - moved} not scheduled (already due or running), left alone"
        level = messages.SUCCESS if moved == selected else messages.WARNING
        self.message_user(request, f"{message}.", level)

    cancel = cancel_jobs  # the action "cancel" of this list, "cancel_jobs" of the running jobs


@admin.register(RunningJob)
class RunningJobAdmin(CancelPermission, NameQueueColumns, OperationsAdmin):
    # Fits 1280 px with the sidebar open: the attempt, its start and its lease in one column.
    list_display = ["name_cell", "queue_cell", "worker", "attempt", "progress_bar"]
    list_filter = ["queue", "name"]
    search_fields = ["id", "name", "key"]
    actions = [cancel_jobs]
    readonly_fields = [
        "id",
        "name",
        "queue",
        "priority",
        "attempts",
        "max_attempts",
        "key",
        "locked_by",
        "started_at_time",
        "attempted_at_time",
        "lease_expires_at_time",
        "cancel_requested_at_time",
        "progress_bar",
    ]
    started_at_time = when_field(Job, "started_at")
    attempted_at_time = when_field(Job, "attempted_at")
    lease_expires_at_time = when_field(Job, "lease_expires_at")
    cancel_requested_at_time = when_field(Job, "cancel_requested_at")

    def get_queryset(self, request: HttpRequest) -> Any:
        # Neither is shown here, and a hand-edited errors column may be past json's depth.
        return cast(JobQuerySet, super().get_queryset(request)).running().defer("payload", "errors")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("progress"))
    def progress_bar(self, obj: Job) -> SafeString | str:
        return progress_html(obj.progress)

    @admin.display(description=_("worker"))
    def worker(self, obj: Job) -> SafeString | str:
        return cell(worker_of(obj.locked_by or ""), 48, name=True)

    @admin.display(description=_("attempt / lease"), ordering="attempted_at")
    def attempt(self, obj: Job) -> SafeString:
        cancel = (
            format_html(
                '<br><strong class="django-jobs-paused" title="{}">{}</strong>',
                when(obj.cancel_requested_at),
                _("cancel asked"),
            )
            if obj.cancel_requested_at
            else ""
        )
        return format_html(
            '{}<br><span class="django-jobs-quiet">{} {}<br>{} {}</span>{}',
            _("attempt %(n)s of %(of)s") % {"n": obj.attempts, "of": obj.max_attempts},
            _("since"),
            list_when(obj.attempted_at),
            _("lease until"),
            list_when(obj.lease_expires_at),
            cancel,
        )


def progress_html(value: Any) -> SafeString | str:
    """A bar (or, with no total, the count) and the note of a stored ctx.progress()."""
    found = progress.read(value)
    if found is None:
        return "-"
    text = cell(str(found), 60)
    if found.fraction is None:
        return text
    return format_html(
        '<progress class="django-jobs-progress" max="1000" value="{}" title="{}"></progress><br>{}',
        round(found.fraction * 1000),
        str(found),
        text,
    )
