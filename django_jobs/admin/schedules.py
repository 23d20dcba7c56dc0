"""The schedule admin: enable and disable schedules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs import schedules
from django_jobs.admin.base import OperationsAdmin
from django_jobs.admin.display import cell, list_when, pretty_payload
from django_jobs.models import CompletionMarker, DeadLetter, Job, Schedule

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


@admin.register(Schedule)
class ScheduleAdmin(OperationsAdmin):
    # Fits 1280 px with the sidebar open: the job under the schedule's name, one state column.
    list_display = ["name_cell", "when", "state", "next_run", "last_run"]
    list_filter = ["enabled", "declared"]
    search_fields = ["name", "job_name"]
    actions = ["enable_schedules", "disable_schedules"]
    readonly_fields = [
        "name",
        "cron",
        "every",
        "timezone",
        "job_name",
        "payload_json",
        "queue",
        "priority",
        "enabled",
        "declared",
        "created_at",
        "updated_at",
        "last_tick_at",
        "last_enqueued_at",
        "last_job_id",
    ]

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
            cell(obj.name, 48, name=True),
            cell(obj.job_name, 64, name=True),
        )

    @admin.display(description=_("state"), ordering="enabled")
    def state(self, obj: Schedule) -> SafeString | StrOrPromise:
        if not obj.declared:
            return format_html(
                '<span title="{}">{}</span>',
                _("No worker's code declares it: it does not tick."),
                _("not declared"),
            )
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
        alias = obj._state.db or Job.objects.db  # a schedule enqueues on its own database
        if Job.objects.using(alias).filter(id=obj.last_job_id).exists():
            state = _("live")
        elif CompletionMarker.objects.using(alias).filter(job_id=obj.last_job_id).exists():
            state = _("done")
        elif DeadLetter.objects.using(alias).filter(id=obj.last_job_id).exists():
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
